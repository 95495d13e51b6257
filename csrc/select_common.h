// Argument checks and layout planning shared by the CPU and CUDA select kernels.
//
// select(pred, true_values, false_values) is select_n with two branches: branch 0 is
// true_values (taken where pred is true), branch 1 is false_values. `cases` below is
// always branch-major: cases[k * n_out + i] is branch k's output i.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <string>
#include <vector>

#include "select_plan.h"

namespace torchcond {

struct SelectOutput {
  int64_t index;                            // which output of the op
  at::Tensor out;                           // fresh, contiguous
  size_t layout;                            // offset of its layout in SelectCall::arena
  int ndim;                                 // coalesced rank
  int R;                                    // stride of the layout's arrays
  int64_t itemsize;
};

struct SelectCall {
  at::Tensor selector;
  int32_t sel_kind;                         // select_plan::SelKind
  int64_t num_branches;
  std::vector<at::TensorList> branches;     // branches[k][i]: branch k's value for output i
  std::vector<at::Tensor> outputs;          // every output, empty ones included
  std::vector<SelectOutput> work;           // only the non-empty outputs
  std::vector<int64_t> arena;               // every layout (see select_plan::LayoutRef)

  const at::Tensor& value(int64_t k, const SelectOutput& w) const { return branches[k][w.index]; }
  select_plan::LayoutRef layout(const SelectOutput& w) const {
    return select_plan::LayoutRef{arena.data() + w.layout, w.ndim, w.R};
  }
};

// Checks the arguments (messages name the argument, what was expected and what was
// found), allocates the outputs and plans each non-empty one. `is_bool_select`:
// select (bool pred, two branches) rather than select_n (integer index).
// The tensors of `branches` must outlive the returned call (they are the op's
// arguments). select_n: `cases` split into num_branches lists of n_out values.
SelectCall prepare_select(
    const at::Tensor& selector,
    std::vector<at::TensorList> branches,
    bool is_bool_select);

SelectCall prepare_select_n(const at::Tensor& index, at::TensorList cases, int64_t num_branches);

// select(pred, true_values, false_values): the two lists must pair up.
SelectCall prepare_select_bool(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values);

}  // namespace torchcond

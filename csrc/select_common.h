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
  int64_t index;   // which output of the op
  at::Tensor out;  // fresh, contiguous
  size_t layout;   // offset of its layout in SelectCall::arena
  int ndim;        // coalesced rank
  int array_len;   // length of each of the layout's arrays
  int64_t itemsize;
};

struct SelectCall {
  at::Tensor selector;
  select_plan::SelKind sel_kind = select_plan::kSelBool;
  int64_t num_branches;
  std::vector<at::TensorList> branches;  // branches[k][i]: branch k's value for output i
  std::vector<at::Tensor> outputs;       // every output, empty ones included
  std::vector<SelectOutput> work;        // only the non-empty outputs
  std::vector<int64_t> arena;            // every layout (see select_plan::LayoutRef)

  const at::Tensor& value(int64_t k, const SelectOutput& w) const { return branches[k][w.index]; }
  select_plan::LayoutRef layout(const SelectOutput& w) const {
    return select_plan::LayoutRef{arena.data() + w.layout, w.ndim, w.array_len};
  }
};

// The one place select's arguments are checked: the CPU and CUDA kernels call these
// through prepare_select_*, and the fake (meta) rule in torchcond/select_ops.py calls
// them through torchcond._C (_check_select/_check_select_n), so eager calls, meta
// tensors and fake tensors under tracing raise the same errors. Each message names
// the argument, what was expected and what was found, in the words of the public
// torchcond.select/select_n (a select_n value is cases[k][i]: branch k's output i);
// it starts with "torchcond::select: " or "torchcond::select_n: ", which the Python
// entry points strip when they raise it as a CondArgumentError. Wrong values raise
// c10::ValueError (Python ValueError), wrong dtypes or layouts c10::TypeError.
// Shapes are read as SymInts: under symbolic tracing a comparison guards.
void check_select(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values);
void check_select_n(const at::Tensor& index, at::TensorList cases, int64_t num_branches);

// Checks the arguments (as above), allocates the outputs and plans each non-empty
// one. The tensors of the lists must outlive the returned call (they are the op's
// arguments).
SelectCall prepare_select_bool(const at::Tensor& pred, at::TensorList true_values, at::TensorList false_values);

// select_n: `cases` is branch-major, num_branches lists of n_out values.
SelectCall prepare_select_n(const at::Tensor& index, at::TensorList cases, int64_t num_branches);

}  // namespace torchcond

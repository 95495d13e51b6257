// The tensor moves of torchcond/_src/batching.py's vmap rule, one call per list: the
// batch's own tensors, batch dimension first, of values seen at a vmap level; and
// those tensors seen at the level again.
#include <ATen/ATen.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <vector>

#include "write_recorder.h"

namespace torchcond {
namespace {

// The batch's own tensor for `t` at vmap `level`, batch dimension first: an unbatched
// value is expanded to the batch without a copy.
// Sizes are SymInts: the rule also runs in traces with symbolic shapes.
at::Tensor batch_first(const at::Tensor& t, int64_t level, const c10::SymInt& size) {
  const auto* batched = at::functorch::maybeGetBatchedImpl(t);
  if (batched != nullptr && batched->level() == level) {
    const at::Tensor& physical = batched->value();
    return batched->bdim() == 0 ? physical : physical.movedim(batched->bdim(), 0);
  }
  std::vector<c10::SymInt> shape{size};
  const auto sizes = t.sym_sizes();
  shape.insert(shape.end(), sizes.begin(), sizes.end());
  return t.expand_symint(shape);
}

}  // namespace

void bind_batching(pybind11::module& m) {
  m.def(
      "batch_first",
      [](const std::vector<std::optional<at::Tensor>>& values, int64_t level, const c10::SymInt& size) {
        std::vector<std::optional<at::Tensor>> out;
        out.reserve(values.size());
        for (const auto& v : values) out.push_back(v ? std::optional<at::Tensor>(batch_first(*v, level, size)) : v);
        return out;
      },
      "Each value's batch tensor at vmap `level`, batch dimension first (None stays None).");
  m.def(
      "batched",
      [](const std::vector<at::Tensor>& values, int64_t level) {
        std::vector<at::Tensor> out;
        out.reserve(values.size());
        for (const auto& v : values) out.push_back(at::functorch::addBatchDim(v, 0, level));
        return out;
      },
      "Each tensor seen at vmap `level`, its first dimension the batch.");
}

}  // namespace torchcond

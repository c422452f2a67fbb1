// Batches as Lightning passes them: a tensor, or tuples / lists / dicts of them, nested. These
// helpers walk such a tree: batch_to_device, the precision plugins' input casts, and dp's
// scatter all reduce to them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"

namespace dtrain {

// A batch of the same structure with every tensor replaced by fn(tensor); other leaves
// (numbers, strings) are kept.
c10::IValue MapTensors(const c10::IValue& batch,
                       const std::function<at::Tensor(const at::Tensor&)>& fn);

// Calls fn on the batch's tensors depth first, without rebuilding the tree, until fn returns
// false; returns whether it went through them all. The step path asks every batch how many rows
// it has, and a MapTensors rebuild allocates each time.
bool VisitTensors(const c10::IValue& batch, const std::function<bool(const at::Tensor&)>& fn);

// Lightning's batch_to_device: every tensor of the batch on `device` (those already there are
// kept as they are); other leaves are kept.
c10::IValue MoveBatchToDevice(const c10::IValue& batch, c10::Device device);

// Dimension 0 of the first tensor in the tree (depth first); 0 when there is none.
int64_t BatchSize(const c10::IValue& batch);

// Splits every tensor along dimension 0 into at most n nearly equal parts (as torch's
// scatter does: fewer parts when the batch is smaller than n); other leaves are replicated.
// INVALID_ARGUMENT when the tensors disagree on dimension 0.
absl::StatusOr<std::vector<c10::IValue>> SplitBatch(const c10::IValue& batch, int n);

// The batch's structure as text, for a dry run's report: "tuple(float32[32, 1, 28, 28],
// int64[32])", dicts as "dict(image: uint8[8, 3, 2, 2], ...)"; dtypes by Python's names, never
// the values; any other leaf as its kind ("Int", "String").
std::string DescribeBatch(const c10::IValue& v);

}  // namespace dtrain

// A training call's per-batch results in LocalResult.packed (StepRequest.packed_results): the
// worker packs them when every batch carries scalars and learning rates only, and the
// coordinator checks a packed answer's shape before it reads it. Packed, a batch costs a few
// bytes on the wire and no map to build or parse; a call of a fast model answers hundreds.
#pragma once

#include "absl/status/status.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

// Moves `result`'s batches into result->packed when each holds only scalars (the same names in
// every batch), step flags and learning rates (the same names in every batch that stepped, none
// in the others); otherwise leaves `result` as it is. True when it packed them.
bool PackBatchResults(v1::LocalResult* result);

// INVALID_ARGUMENT unless every repeated field of `packed` has one entry per batch (scalar
// values: one per batch and name; rate values: one per stepped batch and rate name), and its
// batch count is at most `most`.
absl::Status CheckPackedBatchResults(const v1::PackedBatchResults& packed, int64_t most);

}  // namespace dtrain

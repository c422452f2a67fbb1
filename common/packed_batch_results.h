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

// A rank's answer to a call of `count` batches from batch `first`, when it came packed:
// INVALID_ARGUMENT unless its packed results start at `first`, hold at most `count` batches,
// come without BatchResults beside them, and every repeated field has one entry per batch
// (scalar values: one per batch and name; rate values: one per stepped batch and rate name).
absl::Status CheckPackedBatchResults(const v1::LocalResult& answer, int64_t first, int64_t count);

}  // namespace dtrain

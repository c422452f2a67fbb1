// A training call's per-batch results in LocalResult.packed (StepRequest.packed_results): the
// worker packs them when every batch carries scalars and learning rates only, and the
// coordinator checks a packed answer's shape before it reads it. Packed, a batch costs a few
// bytes on the wire and no map to build or parse; a call of a fast model answers hundreds.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
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

// One batch of a packed answer, as read in place: `scalars` holds a value per scalar name and
// `rates` a value per rate name when the batch stepped (null otherwise), in the names' order.
struct PackedBatch {
  int64_t size = 0;
  bool optimizer_stepped = false;
  bool step_skipped = false;
  const double* scalars = nullptr;
  const double* rates = nullptr;
};

// Calls `visit` for each batch of `packed` in order. The one place that knows where a batch's
// values sit; only for an answer CheckPackedBatchResults passed, which guarantees every read
// stays inside its field.
void ForEachPackedBatch(const v1::PackedBatchResults& packed,
                        absl::FunctionRef<void(const PackedBatch&)> visit);

}  // namespace dtrain

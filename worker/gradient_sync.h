// DDP's data-parallel glue over the coordinator's collectives: parameters broadcast from one
// rank so every rank starts identical, and gradients averaged across ranks after backward, in
// buckets (parameters packed, in order and by dtype, into flat buffers of at most
// bucket_bytes), never one collective per parameter.
//
// Thread-safety: one thread at a time (it issues collectives in order).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "absl/status/status.h"
#include "worker/collective_backend.h"

namespace dtrain {

inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;  // as torch DDP

// Overwrites `tensors` with rank `src`'s values, packed into one broadcast.
absl::Status BroadcastTensors(CollectiveBackend* backend, const std::vector<torch::Tensor>& tensors,
                              int src);

class GradientSync {
 public:
  // `parameters` are taken in order; all ranks must pass the same list (names, shapes, dtypes).
  GradientSync(CollectiveBackend* backend, std::vector<torch::Tensor> parameters,
               int64_t bucket_bytes = kDefaultBucketBytes);

  // Overwrites every parameter with rank `src`'s values.
  absl::Status BroadcastParameters(int src = 0);

  // Replaces each gradient by its mean over ranks (a missing gradient counts as zeros).
  absl::Status AverageGradients();

  // How the parameters were packed: number of buckets (one collective each).
  size_t bucket_count() const { return buckets_.size(); }

 private:
  CollectiveBackend* const backend_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::vector<size_t>> buckets_;  // indices into parameters_
};

}  // namespace dtrain

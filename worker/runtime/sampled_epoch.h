// A training call's LocalWork.sampled made into this rank's batches: the call checked against the
// worker's own data and the epoch's batches before anything is allocated, and the epoch's deal
// (common/distributed_sampler.h) kept for the epoch's later calls. Plain C++: no libtorch.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

// Where this rank's deal comes from: the worker's train split and the group.
struct DealingRank {
  int64_t train_size = 0;
  bool streamed = false;  // data.shards: batches are positions in the rank's epoch
  int world = 1;
  int rank = 0;
};

class SampledEpoch {
 public:
  // OK for work that lists its batches. Otherwise checks work.sampled() (FAILED_PRECONDITION for
  // another deal, INVALID_ARGUMENT for settings past the data or the epoch) and deals `epoch`.
  absl::Status Deal(const v1::LocalWork& work, int64_t epoch, const DealingRank& dealer);
  // Batch i of `work`, which Deal accepted last.
  std::vector<int64_t> Batch(const v1::LocalWork& work, int i) const;

 private:
  // What the kept deal was made from.
  int64_t samples_ = -1;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  int64_t epoch_ = -1;
  std::vector<int64_t> indices_;
};

}  // namespace dtrain

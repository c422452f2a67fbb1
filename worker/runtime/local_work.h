// How many batches a step's LocalWork carries, in whichever of its forms (tensors, index lists,
// or a sampler's description): the service orders and counts calls by it before a job runs them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "dtrain/v1/worker.pb.h"

namespace dtrain {

inline int64_t LocalWorkBatches(const v1::LocalWork& work) {
  if (work.batches_size() > 0) return work.batches_size();
  if (work.index_batches_size() > 0) return work.index_batches_size();
  // A negative count (refused when the call runs) orders and counts as none.
  return work.has_sampled() ? std::max<int64_t>(0, work.sampled().batch_count()) : 0;
}

}  // namespace dtrain

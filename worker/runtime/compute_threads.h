// libtorch's intra-op thread count, settable without including libtorch's headers (the
// daemon's main stays a fast-compiling translation unit).
#pragma once

#include <vector>

#include "absl/status/status.h"

namespace dtrain {

// 0: libtorch's default (one per core). Several workers on one machine should share its cores
// rather than each claim all of them. OpenMP keeps the count per thread: it applies to the
// calling thread (and the OpenMP teams it starts), so the thread that runs steps calls it too.
void SetComputeThreads(int threads);

// Moves the calling thread and the compute threads it has already started (OpenMP's team keeps
// the mask each thread had when it was made) to `cpus`, with `threads` of them; empty `cpus`:
// `allowed`, i.e. unpinned. For a worker whose placement changes between jobs (--cpus=auto).
absl::Status MoveComputeThreads(const std::vector<int>& cpus, const std::vector<int>& allowed,
                                int threads);

}  // namespace dtrain

// libtorch's intra-op thread count, settable without including libtorch's headers (the
// daemon's main stays a fast-compiling translation unit).
#pragma once

namespace dtrain {

// 0: libtorch's default (one per core). Several workers on one machine should share its cores
// rather than each claim all of them. OpenMP keeps the count per thread: it applies to the
// calling thread (and the OpenMP teams it starts), so the thread that runs steps calls it too.
void SetComputeThreads(int threads);

}  // namespace dtrain

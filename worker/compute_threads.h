// libtorch's intra-op thread count, settable without including libtorch's headers (the
// daemon's main stays a fast-compiling translation unit).
#pragma once

namespace dtrain {

// 0: libtorch's default (one per core). Several workers on one machine should share its cores
// rather than each claim all of them.
void SetComputeThreads(int threads);

}  // namespace dtrain

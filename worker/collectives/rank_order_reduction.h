// The arithmetic of the shared-memory plane's all_reduce: every rank's buffer reduced element by
// element in rank order (in_0 op in_1 op ... op in_{n-1}; the mean divided once at the end) and
// written to any number of outputs in the same pass. Both of the plane's all_reduce paths call
// it, so their results are bitwise the same by construction.
//
// Hand-written rather than composed of libtorch ops: done with add_out, div_ and one copy_ per
// output, a 2-rank mean of a 392 KiB partition took ~110 us (five passes over the data and a
// dispatch per op and piece), where one fused pass over L1-sized blocks is memory-bound; the
// MLP's step is ~1.4 ms, so that difference alone was ~5% of a training step.
#ifndef DTRAIN_WORKER_RANK_ORDER_REDUCTION_H_
#define DTRAIN_WORKER_RANK_ORDER_REDUCTION_H_

#include <cstdint>

namespace dtrain {

enum class ReductionKind { kSum, kMean, kMax, kMin };

// out[k][i] = in[0][i] op in[1][i] op ... op in[inputs - 1][i] for every output k and every
// i < count, divided by `inputs` for kMean. Max and min propagate NaN, as torch.maximum and
// torch.minimum do. An output may be one of the inputs (the reduction reads a block of every
// input before it writes that block anywhere); otherwise outputs and inputs must not overlap.
// Defined for float, double, int32_t and int64_t (integers wrap on overflow, as Gloo's do, and
// their mean rounds toward zero, as every plane's does). Runs the widest build of the kernel this
// CPU supports.
template <typename T>
void ReduceInRankOrder(const T* const* in, int inputs, T* const* out, int outputs, int64_t count,
                       ReductionKind kind);

// The same, always in the build for any CPU: for tests that compare the builds bitwise.
template <typename T>
void ReduceInRankOrderGeneric(const T* const* in, int inputs, T* const* out, int outputs,
                              int64_t count, ReductionKind kind);

// Which build ReduceInRankOrder runs here: "avx2" or "generic".
const char* ReductionInstructionSet();

}  // namespace dtrain

#endif  // DTRAIN_WORKER_RANK_ORDER_REDUCTION_H_

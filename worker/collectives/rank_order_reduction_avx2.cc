// The shm plane's reduction kernel built with -mavx2 (see worker/CMakeLists.txt); called only
// after the CPU was checked for AVX2 (rank_order_reduction.cc). Measured on a family-25 EPYC with
// the 101,765-float half of the MLP's gradient, 2 ranks into 2 outputs, in cache: 41 us for the
// baseline x86-64 build (SSE2), 29 us with AVX2 (a probe, before the mean's division joined the
// last addition's pass); bench/reduction_bench.cc now measures both builds (docs/BENCHMARKS.md).
#include "worker/collectives/rank_order_reduction_kernel.inc"

namespace dtrain {

template <typename T>
void ReduceInRankOrderAvx2(const T* const* in, int inputs, T* const* out, int outputs,
                           int64_t count, ReductionKind kind) {
  ReduceKernel<T>(in, inputs, out, outputs, count, kind);
}

template void ReduceInRankOrderAvx2<float>(const float* const*, int, float* const*, int, int64_t,
                                           ReductionKind);
template void ReduceInRankOrderAvx2<double>(const double* const*, int, double* const*, int, int64_t,
                                            ReductionKind);

template void ReduceInRankOrderAvx2<int32_t>(const int32_t* const*, int, int32_t* const*, int,
                                             int64_t, ReductionKind);
template void ReduceInRankOrderAvx2<int64_t>(const int64_t* const*, int, int64_t* const*, int,
                                             int64_t, ReductionKind);

}  // namespace dtrain

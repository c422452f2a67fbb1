// ReduceInRankOrder: the kernel (rank_order_reduction_kernel.inc) built for any CPU here, and
// the AVX2 build of the same kernel (rank_order_reduction_avx2.cc) chosen at run time where the
// CPU has it, as ATen chooses its kernels: a worker binary built on one machine must still run
// on a CPU without AVX2.
#include "worker/collectives/rank_order_reduction.h"

#include "worker/collectives/rank_order_reduction_kernel.inc"

namespace dtrain {

#if defined(DTRAIN_REDUCTION_AVX2)
// Defined in rank_order_reduction_avx2.cc.
template <typename T>
void ReduceInRankOrderAvx2(const T* const* in, int inputs, T* const* out, int outputs,
                           int64_t count, ReductionKind kind);
#endif

namespace {

bool UseAvx2() {
#if defined(DTRAIN_REDUCTION_AVX2)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

}  // namespace

template <typename T>
void ReduceInRankOrder(const T* const* in, int inputs, T* const* out, int outputs, int64_t count,
                       ReductionKind kind) {
#if defined(DTRAIN_REDUCTION_AVX2)
  if (UseAvx2()) {
    ReduceInRankOrderAvx2<T>(in, inputs, out, outputs, count, kind);
    return;
  }
#endif
  ReduceKernel<T>(in, inputs, out, outputs, count, kind);
}

template <typename T>
void ReduceInRankOrderGeneric(const T* const* in, int inputs, T* const* out, int outputs,
                              int64_t count, ReductionKind kind) {
  ReduceKernel<T>(in, inputs, out, outputs, count, kind);
}

const char* ReductionInstructionSet() { return UseAvx2() ? "avx2" : "generic"; }

template void ReduceInRankOrder<float>(const float* const*, int, float* const*, int, int64_t,
                                       ReductionKind);
template void ReduceInRankOrder<double>(const double* const*, int, double* const*, int, int64_t,
                                        ReductionKind);
template void ReduceInRankOrderGeneric<float>(const float* const*, int, float* const*, int, int64_t,
                                              ReductionKind);
template void ReduceInRankOrderGeneric<double>(const double* const*, int, double* const*, int,
                                               int64_t, ReductionKind);

template void ReduceInRankOrder<int32_t>(const int32_t* const*, int, int32_t* const*, int, int64_t,
                                         ReductionKind);
template void ReduceInRankOrder<int64_t>(const int64_t* const*, int, int64_t* const*, int, int64_t,
                                         ReductionKind);
template void ReduceInRankOrderGeneric<int32_t>(const int32_t* const*, int, int32_t* const*, int,
                                                int64_t, ReductionKind);
template void ReduceInRankOrderGeneric<int64_t>(const int64_t* const*, int, int64_t* const*, int,
                                                int64_t, ReductionKind);

}  // namespace dtrain

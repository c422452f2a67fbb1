#include "worker/rank_order_reduction.h"

#include <cstring>

namespace dtrain {
namespace {

// Elements per block: the block's accumulator stays in L1 between the reduction and the writes,
// and a fixed trip count lets the compiler vectorize the loops below at -O2.
constexpr int64_t kBlock = 512;

template <typename T>
inline T Max(T a, T b) {
  return (a > b || a != a) ? a : b;  // a NaN on either side wins
}
template <typename T>
inline T Min(T a, T b) {
  return (a < b || a != a) ? a : b;
}

// acc = a op b (a given), or acc = acc op b (a null), element by element.
template <int64_t N, typename T, typename Op>
inline void Fold(T* __restrict acc, const T* __restrict a, const T* __restrict b, int64_t n,
                 Op op) {
  const int64_t len = N > 0 ? N : n;
  if (a != nullptr) {
    for (int64_t i = 0; i < len; ++i) acc[i] = op(a[i], b[i]);
  } else {
    for (int64_t i = 0; i < len; ++i) acc[i] = op(acc[i], b[i]);
  }
}

// acc = in[0] op ... op in[inputs - 1] over n elements from `at` (divided for the mean).
template <typename T, int64_t N>
inline void ReduceBlock(T* __restrict acc, const T* const* in, int inputs, int64_t at, int64_t n,
                        ReductionKind kind) {
  const int64_t len = N > 0 ? N : n;
  const T* __restrict first = in[0] + at;
  if (inputs == 1) {
    for (int64_t i = 0; i < len; ++i) acc[i] = first[i];
  }
  for (int r = 1; r < inputs; ++r) {
    // The first pair reads in[0]; later ranks fold into the accumulator in place.
    const T* a = r == 1 ? first : nullptr;
    const T* b = in[r] + at;
    switch (kind) {
      case ReductionKind::kSum:
      case ReductionKind::kMean:
        Fold<N>(acc, a, b, n, [](T x, T y) { return x + y; });
        break;
      case ReductionKind::kMax:
        Fold<N>(acc, a, b, n, Max<T>);
        break;
      case ReductionKind::kMin:
        Fold<N>(acc, a, b, n, Min<T>);
        break;
    }
  }
  if (kind == ReductionKind::kMean) {
    const T world = static_cast<T>(inputs);
    for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / world;
  }
}

}  // namespace

template <typename T>
void ReduceInRankOrder(const T* const* in, int inputs, T* const* out, int outputs, int64_t count,
                       ReductionKind kind) {
  alignas(64) T acc[kBlock];
  int64_t at = 0;
  for (; at + kBlock <= count; at += kBlock) {
    ReduceBlock<T, kBlock>(acc, in, inputs, at, kBlock, kind);
    for (int k = 0; k < outputs; ++k) std::memcpy(out[k] + at, acc, sizeof(acc));
  }
  if (at < count) {
    const int64_t n = count - at;
    ReduceBlock<T, 0>(acc, in, inputs, at, n, kind);
    for (int k = 0; k < outputs; ++k) std::memcpy(out[k] + at, acc, n * sizeof(T));
  }
}

template void ReduceInRankOrder<float>(const float* const*, int, float* const*, int, int64_t,
                                       ReductionKind);
template void ReduceInRankOrder<double>(const double* const*, int, double* const*, int, int64_t,
                                        ReductionKind);

}  // namespace dtrain

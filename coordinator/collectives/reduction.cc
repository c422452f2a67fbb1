#include "coordinator/collectives/reduction.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/half.h"

namespace dtrain {
namespace {

// Elements per block: the accumulator stays in L1 while every rank's input streams through.
constexpr int64_t kBlock = 1024;

// How a stored element (S) is widened to its accumulator (A) and narrowed back.
template <typename S, typename A>
struct Plain {
  using Storage = S;
  using Acc = A;
  static A Load(S s) { return static_cast<A>(s); }
  static S Store(A a) { return static_cast<S>(a); }
};
struct Half {
  using Storage = uint16_t;
  using Acc = float;
  static float Load(uint16_t s) { return HalfToFloat(s); }
  static uint16_t Store(float a) { return FloatToHalf(a); }
};
struct BFloat {
  using Storage = uint16_t;
  using Acc = float;
  static float Load(uint16_t s) { return BFloat16ToFloat(s); }
  static uint16_t Store(float a) { return FloatToBFloat16(a); }
};

template <typename T>
T WrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename T>
T WrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // unsigned int at least, so that small types do not promote to signed int and overflow.
    using U = std::common_type_t<std::make_unsigned_t<T>, unsigned int>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

struct SumOp {
  template <typename T>
  static T Apply(T a, T b) {
    return WrapAdd(a, b);
  }
};
struct ProdOp {
  template <typename T>
  static T Apply(T a, T b) {
    return WrapMul(a, b);
  }
};
// b != b is true only for NaN, which must win as it does in torch.
struct MaxOp {
  template <typename T>
  static T Apply(T a, T b) {
    return (b > a || b != b) ? b : a;
  }
};
struct MinOp {
  template <typename T>
  static T Apply(T a, T b) {
    return (b < a || b != b) ? b : a;
  }
};

template <typename Traits, typename Op, bool kMean>
void ReduceTyped(const std::vector<const char*>& inputs, int64_t numel, char* out) {
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  // Buffers are read in place as S (this file is built with -fno-strict-aliasing).
  const int64_t ranks = static_cast<int64_t>(inputs.size());
  S* dst = reinterpret_cast<S*>(out);
  A acc[kBlock];
  for (int64_t start = 0; start < numel; start += kBlock) {
    const int64_t n = std::min(kBlock, numel - start);
    const S* first = reinterpret_cast<const S*>(inputs[0]) + start;
    for (int64_t i = 0; i < n; ++i) acc[i] = Traits::Load(first[i]);
    for (int64_t r = 1; r < ranks; ++r) {
      const S* in = reinterpret_cast<const S*>(inputs[r]) + start;
      for (int64_t i = 0; i < n; ++i) acc[i] = Op::Apply(acc[i], Traits::Load(in[i]));
    }
    if constexpr (kMean) {
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] / static_cast<A>(ranks);
    }
    for (int64_t i = 0; i < n; ++i) dst[start + i] = Traits::Store(acc[i]);
  }
}

template <typename Traits>
void ReduceWithOp(v1::ReduceOp op, const std::vector<const char*>& in, int64_t numel, char* out) {
  switch (op) {
    case v1::REDUCE_OP_SUM:
      return ReduceTyped<Traits, SumOp, false>(in, numel, out);
    case v1::REDUCE_OP_MEAN:
      return ReduceTyped<Traits, SumOp, true>(in, numel, out);
    case v1::REDUCE_OP_MAX:
      return ReduceTyped<Traits, MaxOp, false>(in, numel, out);
    case v1::REDUCE_OP_MIN:
      return ReduceTyped<Traits, MinOp, false>(in, numel, out);
    case v1::REDUCE_OP_PRODUCT:
      return ReduceTyped<Traits, ProdOp, false>(in, numel, out);
    default:
      return;  // excluded by CheckReducible
  }
}

// Integer mean: sum in 64 bits, divide once (C++ division rounds toward zero).
template <typename S>
void ReduceIntegerMean(const std::vector<const char*>& in, int64_t numel, char* out) {
  ReduceTyped<Plain<S, int64_t>, SumOp, true>(in, numel, out);
}

// Bool: sum and max are logical or, product and min logical and; results are 0 or 1.
void ReduceBool(v1::ReduceOp op, const std::vector<const char*>& in, int64_t numel, char* out) {
  const bool is_or = op == v1::REDUCE_OP_SUM || op == v1::REDUCE_OP_MAX;
  auto* dst = reinterpret_cast<uint8_t*>(out);
  const auto* first = reinterpret_cast<const uint8_t*>(in[0]);
  for (int64_t i = 0; i < numel; ++i) dst[i] = first[i] != 0;
  for (size_t r = 1; r < in.size(); ++r) {
    const auto* src = reinterpret_cast<const uint8_t*>(in[r]);
    if (is_or) {
      for (int64_t i = 0; i < numel; ++i) dst[i] = dst[i] | (src[i] != 0);
    } else {
      for (int64_t i = 0; i < numel; ++i) dst[i] = dst[i] & (src[i] != 0);
    }
  }
}

}  // namespace

std::string ReduceOpName(v1::ReduceOp op) {
  switch (op) {
    case v1::REDUCE_OP_SUM:
      return "sum";
    case v1::REDUCE_OP_MEAN:
      return "mean";
    case v1::REDUCE_OP_MAX:
      return "max";
    case v1::REDUCE_OP_MIN:
      return "min";
    case v1::REDUCE_OP_PRODUCT:
      return "product";
    default:
      return absl::StrCat("reduce_op(", static_cast<int>(op), ")");
  }
}

absl::Status CheckReducible(v1::DType dtype, v1::ReduceOp op) {
  if (op < v1::REDUCE_OP_SUM || op > v1::REDUCE_OP_PRODUCT) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int>(op),
                                                   "; use sum, mean, max, min or product"));
  }
  if (dtype == v1::DTYPE_BOOL && op == v1::REDUCE_OP_MEAN) {
    return absl::InvalidArgumentError(
        "mean is not defined for bool tensors; use max (any) or min (all)");
  }
  return DTypeSize(dtype).status();
}

absl::Status ReduceBuffers(v1::DType dtype, v1::ReduceOp op, const std::vector<const char*>& inputs,
                           int64_t numel, char* out) {
  if (absl::Status s = CheckReducible(dtype, op); !s.ok()) return s;
  if (inputs.empty()) return absl::InvalidArgumentError("reduction of zero inputs");
  const bool mean = op == v1::REDUCE_OP_MEAN;
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      ReduceWithOp<Plain<float, float>>(op, inputs, numel, out);
      break;
    case v1::DTYPE_FLOAT64:
      ReduceWithOp<Plain<double, double>>(op, inputs, numel, out);
      break;
    case v1::DTYPE_FLOAT16:
      ReduceWithOp<Half>(op, inputs, numel, out);
      break;
    case v1::DTYPE_BFLOAT16:
      ReduceWithOp<BFloat>(op, inputs, numel, out);
      break;
    case v1::DTYPE_INT8:
      mean ? ReduceIntegerMean<int8_t>(inputs, numel, out)
           : ReduceWithOp<Plain<int8_t, int8_t>>(op, inputs, numel, out);
      break;
    case v1::DTYPE_UINT8:
      mean ? ReduceIntegerMean<uint8_t>(inputs, numel, out)
           : ReduceWithOp<Plain<uint8_t, uint8_t>>(op, inputs, numel, out);
      break;
    case v1::DTYPE_INT32:
      mean ? ReduceIntegerMean<int32_t>(inputs, numel, out)
           : ReduceWithOp<Plain<int32_t, int32_t>>(op, inputs, numel, out);
      break;
    case v1::DTYPE_INT64:
      mean ? ReduceIntegerMean<int64_t>(inputs, numel, out)
           : ReduceWithOp<Plain<int64_t, int64_t>>(op, inputs, numel, out);
      break;
    case v1::DTYPE_BOOL:
      ReduceBool(op, inputs, numel, out);
      break;
    default:
      return absl::InvalidArgumentError("unknown dtype");
  }
  return absl::OkStatus();
}

}  // namespace dtrain

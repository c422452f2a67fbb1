#include "tests/reference_data.h"

#include <cmath>
#include <cstring>

#include "common/half.h"

namespace dtrain::testing {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of a tensor as a double, and back, for each dtype.
double Get(const HostTensor& t, int64_t i) {
  const char* p = t.data.data();
  switch (t.dtype) {
    case v1::DTYPE_FLOAT32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case v1::DTYPE_FLOAT64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case v1::DTYPE_FLOAT16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return HalfToFloat(v);
    }
    case v1::DTYPE_BFLOAT16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return BFloat16ToFloat(v);
    }
    case v1::DTYPE_INT8:
      return static_cast<int8_t>(p[i]);
    case v1::DTYPE_UINT8:
      return static_cast<uint8_t>(p[i]);
    case v1::DTYPE_INT32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case v1::DTYPE_INT64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return static_cast<double>(v);
    }
    case v1::DTYPE_BOOL:
      return p[i] != 0;
    default:
      return 0;
  }
}

int64_t GetInt(const HostTensor& t, int64_t i) {
  const char* p = t.data.data();
  if (t.dtype == v1::DTYPE_INT64) {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  }
  return static_cast<int64_t>(Get(t, i));
}

void PutFloat(HostTensor& t, int64_t i, double value) {
  char* p = t.data.data();
  switch (t.dtype) {
    case v1::DTYPE_FLOAT32: {
      float v = static_cast<float>(value);
      std::memcpy(p + 4 * i, &v, 4);
      break;
    }
    case v1::DTYPE_FLOAT64:
      std::memcpy(p + 8 * i, &value, 8);
      break;
    case v1::DTYPE_FLOAT16: {
      uint16_t v = FloatToHalf(static_cast<float>(value));
      std::memcpy(p + 2 * i, &v, 2);
      break;
    }
    case v1::DTYPE_BFLOAT16: {
      uint16_t v = FloatToBFloat16(static_cast<float>(value));
      std::memcpy(p + 2 * i, &v, 2);
      break;
    }
    default:
      break;
  }
}

// Integers are stored by truncating a 64-bit value: that is two's complement wrapping.
void PutInt(HostTensor& t, int64_t i, uint64_t value) {
  char* p = t.data.data();
  switch (t.dtype) {
    case v1::DTYPE_INT8:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_BOOL:
      p[i] = static_cast<char>(value);
      break;
    case v1::DTYPE_INT32: {
      uint32_t v = static_cast<uint32_t>(value);
      std::memcpy(p + 4 * i, &v, 4);
      break;
    }
    case v1::DTYPE_INT64:
      std::memcpy(p + 8 * i, &value, 8);
      break;
    default:
      break;
  }
}

}  // namespace

HostTensor MakeInput(v1::DType dtype, const std::vector<int64_t>& shape, int rank, uint64_t seed) {
  HostTensor t = HostTensor::Zeros(dtype, shape).value();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = Mix(seed * 1000003 + static_cast<uint64_t>(rank) * 7919 + i);
    switch (dtype) {
      case v1::DTYPE_FLOAT32:
      case v1::DTYPE_FLOAT64:
      case v1::DTYPE_FLOAT16:
      case v1::DTYPE_BFLOAT16:
        PutFloat(t, i, (static_cast<double>(r % 40001) - 20000.0) / 10000.0);
        break;
      case v1::DTYPE_INT8:
        PutInt(t, i, static_cast<uint64_t>(static_cast<int64_t>(r % 21) - 10));
        break;
      case v1::DTYPE_UINT8:
        PutInt(t, i, r % 21);
        break;
      case v1::DTYPE_INT32:
      case v1::DTYPE_INT64:
        PutInt(t, i, static_cast<uint64_t>(static_cast<int64_t>(r % 2001) - 1000));
        break;
      case v1::DTYPE_BOOL:
        PutInt(t, i, r % 2);
        break;
      default:
        break;
    }
  }
  return t;
}

HostTensor ReferenceReduce(const std::vector<HostTensor>& inputs, v1::ReduceOp op) {
  HostTensor out = HostTensor::Zeros(inputs[0].dtype, inputs[0].shape).value();
  const int64_t n = out.numel();
  const int ranks = static_cast<int>(inputs.size());
  const v1::DType dtype = out.dtype;
  for (int64_t i = 0; i < n; ++i) {
    if (IsFloatingPoint(dtype)) {
      // float32 and the half types accumulate in float, float64 in double, in rank order.
      const bool wide = dtype == v1::DTYPE_FLOAT64;
      double acc = Get(inputs[0], i);
      float facc = static_cast<float>(acc);
      for (int r = 1; r < ranks; ++r) {
        const double v = Get(inputs[r], i);
        const float fv = static_cast<float>(v);
        switch (op) {
          case v1::REDUCE_OP_SUM:
          case v1::REDUCE_OP_MEAN:
            acc += v;
            facc += fv;
            break;
          case v1::REDUCE_OP_PRODUCT:
            acc *= v;
            facc *= fv;
            break;
          case v1::REDUCE_OP_MAX:
            acc = std::fmax(acc, v);
            facc = std::fmax(facc, fv);
            break;
          case v1::REDUCE_OP_MIN:
            acc = std::fmin(acc, v);
            facc = std::fmin(facc, fv);
            break;
          default:
            break;
        }
      }
      if (op == v1::REDUCE_OP_MEAN) {
        acc /= ranks;
        facc /= static_cast<float>(ranks);
      }
      PutFloat(out, i, wide ? acc : static_cast<double>(facc));
    } else if (dtype == v1::DTYPE_BOOL) {
      const bool is_or = op == v1::REDUCE_OP_SUM || op == v1::REDUCE_OP_MAX;
      bool acc = Get(inputs[0], i) != 0;
      for (int r = 1; r < ranks; ++r) {
        const bool v = Get(inputs[r], i) != 0;
        acc = is_or ? (acc || v) : (acc && v);
      }
      PutInt(out, i, acc ? 1 : 0);
    } else {
      int64_t acc = GetInt(inputs[0], i);
      uint64_t wrapped = static_cast<uint64_t>(acc);
      for (int r = 1; r < ranks; ++r) {
        const int64_t v = GetInt(inputs[r], i);
        switch (op) {
          case v1::REDUCE_OP_SUM:
          case v1::REDUCE_OP_MEAN:
            wrapped += static_cast<uint64_t>(v);
            break;
          case v1::REDUCE_OP_PRODUCT:
            wrapped *= static_cast<uint64_t>(v);
            break;
          case v1::REDUCE_OP_MAX:
            acc = std::max(acc, v);
            break;
          case v1::REDUCE_OP_MIN:
            acc = std::min(acc, v);
            break;
          default:
            break;
        }
      }
      if (op == v1::REDUCE_OP_MAX || op == v1::REDUCE_OP_MIN) {
        PutInt(out, i, static_cast<uint64_t>(acc));
      } else if (op == v1::REDUCE_OP_MEAN) {
        PutInt(out, i, static_cast<uint64_t>(static_cast<int64_t>(wrapped) / ranks));
      } else {
        PutInt(out, i, wrapped);
      }
    }
  }
  return out;
}

}  // namespace dtrain::testing

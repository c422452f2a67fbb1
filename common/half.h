// float16 / bfloat16 <-> float32 conversions for the coordinator's reductions, which
// accumulate half types in float. Rounding is to nearest, ties to even, as torch does.
// float16 uses the compiler's _Float16 (GCC >= 12 on x86-64, IEEE binary16) rather than a
// hand-written bit routine; bfloat16 has no compiler type in GCC 12, so it is the few lines below.
#pragma once

#include <cstdint>
#include <cstring>

namespace dtrain {

// Clang before 15 has no _Float16 on x86-64, but converts its __fp16 storage type the same way
// (used by the clang thread-safety and sanitizer builds).
#if defined(__clang__) && __clang_major__ < 15
using Float16 = __fp16;
#else
using Float16 = _Float16;
#endif

inline float HalfToFloat(uint16_t bits) {
  Float16 h;
  std::memcpy(&h, &bits, sizeof bits);
  return static_cast<float>(h);
}

inline uint16_t FloatToHalf(float value) {
  Float16 h = static_cast<Float16>(value);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

inline float BFloat16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

inline uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

}  // namespace dtrain

// A double from a file or a peer as an int64, without C++'s undefined behaviour: a cast of a NaN,
// an infinity or a value outside int64's range is undefined, and checkpoints and state_dicts
// written by Python may hold any of them where an int is meant.
//
// Thread-safety: a pure function.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

namespace dtrain {

// `value` truncated toward zero, as a cast would; nullopt for a NaN, an infinity, or a value
// whose truncation is outside [-2^63, 2^63).
inline std::optional<int64_t> IntOfDouble(double value) {
  // -2^63 and 2^63 are exact doubles, and no double lies between -2^63 - 1 and -2^63: every
  // double in [-2^63, 2^63) truncates into range.
  constexpr double kLimit = 9223372036854775808.0;
  if (!std::isfinite(value) || value >= kLimit || value < -kLimit) return std::nullopt;
  return static_cast<int64_t>(value);
}

}  // namespace dtrain

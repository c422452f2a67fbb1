// Reader for the IDX format of (Fashion-)MNIST, gzip-compressed as the datasets ship it: a
// big-endian header (two zero bytes, a type code, the number of dimensions, each dimension as
// uint32) followed by the values. Only unsigned bytes (type 0x08) are read: both datasets'
// images and labels use it. zlib does the decompression.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

struct IdxArray {
  std::vector<int64_t> shape;
  std::string data;  // the uint8 values, row-major
};

// Fills up to `n` bytes of `out` from the input; returns how many (0 at its end), -1 on error.
using IdxRead = std::function<int64_t(char* out, int64_t n)>;

// Values dtrain reads from one IDX file: Fashion-MNIST's largest holds 47 million.
inline constexpr int64_t kMaxIdxValues = int64_t{1} << 31;

// An IDX array from `read` (`name` for messages), reading no more than its header declares.
// INVALID_ARGUMENT: not IDX, not uint8, truncated, more values than its header says, or
// dimensions whose product exceeds `max_values` (checked before anything is allocated).
absl::StatusOr<IdxArray> ReadIdx(const IdxRead& read, const std::string& name,
                                 int64_t max_values = kMaxIdxValues);

// NOT_FOUND: no file. INVALID_ARGUMENT: not gzip, or as ReadIdx (the message says which and
// where).
absl::StatusOr<IdxArray> ReadIdxGz(const std::string& path);

}  // namespace dtrain

// Reader for the IDX format of (Fashion-)MNIST, gzip-compressed as the datasets ship it: a
// big-endian header (two zero bytes, a type code, the number of dimensions, each dimension as
// uint32) followed by the values. Only unsigned bytes (type 0x08) are read: both datasets'
// images and labels use it. zlib does the decompression.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

struct IdxArray {
  std::vector<int64_t> shape;
  std::string data;  // the uint8 values, row-major
};

// NOT_FOUND: no file. INVALID_ARGUMENT: not gzip, not IDX, not uint8, or truncated (the
// message says which and where).
absl::StatusOr<IdxArray> ReadIdxGz(const std::string& path);

}  // namespace dtrain

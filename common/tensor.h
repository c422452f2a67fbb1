// HostTensor: a dense tensor held as little-endian bytes in host memory, the unit every dtrain
// API moves; plus validation of wire tensor descriptions (TensorMeta) against hostile input.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "dtrain/v1/tensor.pb.h"

namespace dtrain {

// Largest payload a single tensor may have on the wire (well past the 1 GiB we promise).
inline constexpr int64_t kMaxTensorBytes = int64_t{16} << 30;

struct HostTensor {
  DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::string data;  // exactly numel() * DTypeSize(dtype) bytes

  int64_t numel() const;

  // A tensor of `shape` filled with zero bytes.
  static absl::StatusOr<HostTensor> Zeros(DType dtype, std::vector<int64_t> shape);

  // Copies `values` in; sizeof(T) must equal the dtype's size.
  template <typename T>
  static HostTensor FromVector(DType dtype, std::vector<int64_t> shape,
                               const std::vector<T>& values) {
    HostTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
    return t;
  }

  template <typename T>
  std::vector<T> ToVector() const {
    std::vector<T> out(data.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
    return out;
  }

  bool operator==(const HostTensor& other) const {
    return dtype == other.dtype && shape == other.shape && data == other.data;
  }
};

// Checks a description from the wire: known dtype, no negative dimension, an element count
// that does not overflow, and at most max_bytes. Returns the payload size in bytes.
absl::StatusOr<int64_t> ValidateMeta(const v1::TensorMeta& meta,
                                     int64_t max_bytes = kMaxTensorBytes);

// ValidateMeta plus: `data_bytes` is exactly the size the description implies.
absl::Status ValidatePayload(const v1::TensorMeta& meta, int64_t data_bytes,
                             int64_t max_bytes = kMaxTensorBytes);

// "float32[2, 3]"; scalars print as "float32[]".
std::string DescribeMeta(const v1::TensorMeta& meta);

v1::TensorMeta MetaOf(const HostTensor& tensor);
std::vector<int64_t> ShapeOf(const v1::TensorMeta& meta);

// Wire conversions; FromProto validates.
absl::StatusOr<HostTensor> FromProto(const v1::Tensor& proto);
void ToProto(const HostTensor& tensor, v1::Tensor* proto);

}  // namespace dtrain

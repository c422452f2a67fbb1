#include "worker/model/tensor_convert.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain {

double ReportedScalar(const torch::Tensor& one) {
  return one.is_complex() ? one.to(torch::kFloat64).item<double>() : one.item<double>();
}

absl::StatusOr<torch::ScalarType> ToScalarType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return torch::kFloat32;
    case v1::DTYPE_FLOAT64:
      return torch::kFloat64;
    case v1::DTYPE_FLOAT16:
      return torch::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return torch::kBFloat16;
    case v1::DTYPE_INT8:
      return torch::kInt8;
    case v1::DTYPE_UINT8:
      return torch::kUInt8;
    case v1::DTYPE_INT32:
      return torch::kInt32;
    case v1::DTYPE_INT64:
      return torch::kInt64;
    case v1::DTYPE_BOOL:
      return torch::kBool;
    default:
      return absl::InvalidArgumentError(absl::StrCat("no torch dtype for ", DTypeName(dtype)));
  }
}

absl::StatusOr<v1::DType> ToWireDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return v1::DTYPE_FLOAT32;
    case torch::kFloat64:
      return v1::DTYPE_FLOAT64;
    case torch::kFloat16:
      return v1::DTYPE_FLOAT16;
    case torch::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case torch::kInt8:
      return v1::DTYPE_INT8;
    case torch::kUInt8:
      return v1::DTYPE_UINT8;
    case torch::kInt32:
      return v1::DTYPE_INT32;
    case torch::kInt64:
      return v1::DTYPE_INT64;
    case torch::kBool:
      return v1::DTYPE_BOOL;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("torch dtype ", c10::toString(type), " has no dtrain wire dtype"));
  }
}

absl::StatusOr<torch::Tensor> ToTorch(const HostTensor& tensor) {
  if (absl::Status s = ValidatePayload(MetaOf(tensor), static_cast<int64_t>(tensor.data.size()));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<torch::ScalarType> type = ToScalarType(tensor.dtype);
  if (!type.ok()) return type.status();
  torch::Tensor out = torch::empty(tensor.shape, torch::TensorOptions().dtype(*type));
  if (!tensor.data.empty()) std::memcpy(out.data_ptr(), tensor.data.data(), tensor.data.size());
  return out;
}

absl::StatusOr<HostTensor> FromTorch(const torch::Tensor& tensor) {
  absl::StatusOr<v1::DType> dtype = ToWireDType(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  const torch::Tensor cpu = tensor.to(torch::kCPU).contiguous();
  HostTensor out;
  out.dtype = *dtype;
  out.shape.assign(cpu.sizes().begin(), cpu.sizes().end());
  out.data.assign(static_cast<const char*>(cpu.data_ptr()),
                  static_cast<size_t>(cpu.numel()) * cpu.element_size());
  return out;
}

}  // namespace dtrain

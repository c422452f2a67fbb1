// Conversions between torch::Tensor and dtrain's wire tensor (HostTensor), for every wire
// dtype. The worker's only bridge between libtorch and the coordinator's collectives.
#pragma once

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace dtrain {

// A CPU tensor sharing nothing with `tensor` (its bytes are copied). INVALID_ARGUMENT for a
// malformed HostTensor.
absl::StatusOr<torch::Tensor> ToTorch(const HostTensor& tensor);

// The tensor's values (moved to CPU, made contiguous). INVALID_ARGUMENT for dtypes the wire
// does not carry (complex, quantized, ...).
absl::StatusOr<HostTensor> FromTorch(const torch::Tensor& tensor);

// A one-element tensor's value as the double a step reports (a loss, a logged scalar): the same
// value as .to(kFloat64).item<double>(), read from the element itself for real dtypes, without the
// conversion kernel and the tensor that costs on every training step; complex values keep that
// path (their real part).
double ReportedScalar(const torch::Tensor& one);

absl::StatusOr<torch::ScalarType> ToScalarType(v1::DType dtype);
absl::StatusOr<v1::DType> ToWireDType(torch::ScalarType type);

}  // namespace dtrain

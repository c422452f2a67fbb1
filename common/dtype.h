// Facts about the wire dtypes (dtrain.v1.DType): element size, name, and class.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "dtrain/v1/tensor.pb.h"

namespace dtrain {

using v1::DType;

// Size in bytes of one element; INVALID_ARGUMENT for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<int64_t> DTypeSize(DType dtype);

// "float32", "bfloat16", ...; "dtype(<n>)" for values this build does not know.
std::string DTypeName(DType dtype);

// Parses the names DTypeName prints (and torch's aliases "float", "half", "long", ...).
absl::StatusOr<DType> ParseDType(std::string_view name);

bool IsFloatingPoint(DType dtype);

}  // namespace dtrain

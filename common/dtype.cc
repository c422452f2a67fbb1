#include "common/dtype.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::StatusOr<int64_t> DTypeSize(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_INT8:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_BOOL:
      return 1;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError("tensor dtype is unspecified (DTYPE_UNSPECIFIED)");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor dtype ", static_cast<int>(dtype),
                       "; known: float32, float64, float16, bfloat16, int8, uint8, int32, "
                       "int64, bool"));
  }
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT64:
      return "float64";
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    case v1::DTYPE_INT8:
      return "int8";
    case v1::DTYPE_UINT8:
      return "uint8";
    case v1::DTYPE_INT32:
      return "int32";
    case v1::DTYPE_INT64:
      return "int64";
    case v1::DTYPE_BOOL:
      return "bool";
    default:
      return absl::StrCat("dtype(", static_cast<int>(dtype), ")");
  }
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float32", v1::DTYPE_FLOAT32},   {"float", v1::DTYPE_FLOAT32},
      {"float64", v1::DTYPE_FLOAT64},   {"double", v1::DTYPE_FLOAT64},
      {"float16", v1::DTYPE_FLOAT16},   {"half", v1::DTYPE_FLOAT16},
      {"bfloat16", v1::DTYPE_BFLOAT16}, {"int8", v1::DTYPE_INT8},
      {"uint8", v1::DTYPE_UINT8},       {"int32", v1::DTYPE_INT32},
      {"int", v1::DTYPE_INT32},         {"int64", v1::DTYPE_INT64},
      {"long", v1::DTYPE_INT64},        {"bool", v1::DTYPE_BOOL},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype name '", std::string(name), "'"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == v1::DTYPE_FLOAT32 || dtype == v1::DTYPE_FLOAT64 || dtype == v1::DTYPE_FLOAT16 ||
         dtype == v1::DTYPE_BFLOAT16;
}

}  // namespace dtrain

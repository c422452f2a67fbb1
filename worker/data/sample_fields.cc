#include "worker/data/sample_fields.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/npy_array.h"
#include "worker/data/text_fields.h"
#include "worker/model/torch_save_file.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

struct NamedType {
  const char* name;
  FieldType type;
};
constexpr NamedType kTypeNames[] = {
    {"int", FieldType::kInt},     {"float", FieldType::kFloat}, {"npy", FieldType::kNpy},
    {"json", FieldType::kJson},   {"torch", FieldType::kTorch}, {"text", FieldType::kText},
    {"bytes", FieldType::kBytes}, {"image", FieldType::kImage},
};

struct ExtensionType {
  const char* extension;
  FieldType type;
};
constexpr ExtensionType kExtensions[] = {
    {"cls", FieldType::kInt},    {"cls2", FieldType::kInt},  {"index", FieldType::kInt},
    {"idx", FieldType::kInt},    {"id", FieldType::kInt},    {"npy", FieldType::kNpy},
    {"json", FieldType::kJson},  {"pt", FieldType::kTorch},  {"pth", FieldType::kTorch},
    {"txt", FieldType::kText},   {"text", FieldType::kText}, {"jpg", FieldType::kImage},
    {"jpeg", FieldType::kImage}, {"png", FieldType::kImage}, {"webp", FieldType::kImage},
    {"ppm", FieldType::kImage},  {"pgm", FieldType::kImage},
};

// A 1-d uint8 tensor holding a copy of `bytes`.
at::Tensor ByteTensor(absl::string_view bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

absl::StatusOr<at::ScalarType> TorchDtype(const std::string& npy_dtype) {
  static const std::pair<const char*, at::ScalarType> kTypes[] = {
      {"bool", at::kBool},    {"uint8", at::kByte},    {"int8", at::kChar},
      {"int16", at::kShort},  {"int32", at::kInt},     {"int64", at::kLong},
      {"float16", at::kHalf}, {"float32", at::kFloat}, {"float64", at::kDouble},
  };
  for (const auto& [name, type] : kTypes) {
    if (npy_dtype == name) return type;
  }
  return absl::InternalError(absl::StrCat("no torch dtype for .npy dtype ", npy_dtype));
}

absl::StatusOr<at::Tensor> DecodeNpy(absl::string_view bytes) {
  DTRAIN_ASSIGN_OR_RETURN(const NpyArray array, ParseNpy(bytes));
  DTRAIN_ASSIGN_OR_RETURN(const at::ScalarType dtype, TorchDtype(array.dtype));
  // Column-major data is the row-major array of the reversed shape, transposed.
  std::vector<int64_t> shape = array.shape;
  if (array.fortran_order) std::reverse(shape.begin(), shape.end());
  // ParseNpy checked that the data holds exactly this many bytes, so this allocation is bounded
  // by the input's size.
  at::Tensor t = at::empty(shape, dtype);
  if (!array.data.empty()) std::memcpy(t.data_ptr(), array.data.data(), array.data.size());
  if (dtype == at::kBool) {
    // numpy writes 0 and 1; any other byte would be a bool torch's kernels misread.
    auto* b = static_cast<uint8_t*>(t.data_ptr());
    for (size_t i = 0; i < array.data.size(); ++i) b[i] = b[i] != 0;
  }
  if (array.fortran_order && shape.size() > 1) {
    std::vector<int64_t> reversed(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      reversed[i] = static_cast<int64_t>(shape.size() - 1 - i);
    }
    t = t.permute(reversed).contiguous();
  }
  return t;
}

absl::StatusOr<at::Tensor> DecodeJson(absl::string_view bytes) {
  DTRAIN_ASSIGN_OR_RETURN(const JsonArray array, ParseJsonArray(bytes));
  at::Tensor values = at::empty({static_cast<int64_t>(array.values.size())}, at::kFloat);
  if (!array.values.empty()) {
    std::memcpy(values.data_ptr(), array.values.data(), array.values.size() * sizeof(float));
  }
  if (array.boolean) values = values.ne(0);
  return values.reshape(array.shape).contiguous();
}

// The tensor must stay inside its storage (a torch.save file names sizes, strides and an offset
// independently of its storage's bytes; ParseTorchSave has checked it, and this says so again
// for the tensor a field hands on), and what it shows is bounded: zero strides (an expanded
// tensor) can make a few stored bytes show any number of elements, which a clone would allocate.
absl::Status CheckInsideStorage(const at::Tensor& t) {
  int64_t elements = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 0 || __builtin_mul_overflow(elements, t.size(d), &elements)) {
      return absl::InvalidArgumentError("the tensor's sizes overflow");
    }
  }
  int64_t shown = 0;
  if (__builtin_mul_overflow(elements, static_cast<int64_t>(t.element_size()), &shown) ||
      shown > kMaxFieldBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the tensor shows ", elements,
                                                   " elements, over the field limit of ",
                                                   kMaxFieldBytes, " bytes"));
  }
  return CheckTensorInStorage(t);
}

absl::StatusOr<at::Tensor> DecodeTorch(absl::string_view bytes) {
  DTRAIN_ASSIGN_OR_RETURN(const c10::IValue value,
                          ParseTorchSave(std::string(bytes), "the sample field"));
  if (!value.isTensor()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the torch.save file holds a ", value.tagKind(),
                     ", not one tensor (write it with torch.save(tensor, f))"));
  }
  at::Tensor t = value.toTensor().detach();
  if (t.layout() != at::kStrided || t.is_quantized() || !t.device().is_cpu()) {
    return absl::InvalidArgumentError(
        "the tensor is sparse, quantized or not on the CPU (save a dense CPU tensor)");
  }
  DTRAIN_RETURN_IF_ERROR(CheckInsideStorage(t));
  // A saved view carries its whole base storage (x[0] of a large x): keep only what it shows.
  if (!t.is_contiguous() || t.storage_offset() != 0 ||
      t.storage().nbytes() != static_cast<size_t>(t.nbytes())) {
    t = t.clone(at::MemoryFormat::Contiguous);
  }
  return t;
}

absl::StatusOr<at::Tensor> DecodeChecked(absl::string_view bytes, FieldType type) {
  switch (type) {
    case FieldType::kInt: {
      DTRAIN_ASSIGN_OR_RETURN(const int64_t v, ParseIntText(bytes));
      return at::scalar_tensor(v, at::kLong);
    }
    case FieldType::kFloat: {
      DTRAIN_ASSIGN_OR_RETURN(const float v, ParseFloatText(bytes));
      return at::scalar_tensor(v, at::kFloat);
    }
    case FieldType::kNpy:
      return DecodeNpy(bytes);
    case FieldType::kJson:
      return DecodeJson(bytes);
    case FieldType::kTorch:
      return DecodeTorch(bytes);
    case FieldType::kText:
      // The bytes only: tokenizing is the model's job (its TorchScript or a user transform),
      // since every model has its own vocabulary.
      if (const std::optional<size_t> at = FirstInvalidUtf8(bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "not UTF-8: malformed sequence at byte ", *at, " (use a bytes field for binary data)"));
      }
      return ByteTensor(bytes);
    case FieldType::kBytes:
      return ByteTensor(bytes);
    case FieldType::kImage:
      return absl::InvalidArgumentError("image fields are decoded by the image pipeline");
  }
  return absl::InternalError("unknown field type");
}

}  // namespace

absl::StatusOr<FieldType> FieldTypeFromName(absl::string_view name) {
  for (const NamedType& n : kTypeNames) {
    if (name == n.name) return n.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown field type '", absl::CHexEscape(name.substr(0, 40)),
                   "'; known: int, float, npy, json, torch, text, bytes, image"));
}

const char* FieldTypeName(FieldType type) {
  for (const NamedType& n : kTypeNames) {
    if (n.type == type) return n.name;
  }
  return "unknown";
}

FieldType DefaultFieldType(absl::string_view extension) {
  const size_t dot = extension.rfind('.');
  const std::string last =
      absl::AsciiStrToLower(dot == absl::string_view::npos ? extension : extension.substr(dot + 1));
  for (const ExtensionType& e : kExtensions) {
    if (last == e.extension) return e.type;
  }
  return FieldType::kBytes;
}

absl::StatusOr<at::Tensor> DecodeField(absl::string_view bytes, FieldType type) {
  absl::StatusOr<at::Tensor> tensor;
  if (static_cast<int64_t>(bytes.size()) > kMaxFieldBytes) {
    tensor = absl::InvalidArgumentError(
        absl::StrCat(bytes.size(), " bytes, over the limit of ", kMaxFieldBytes));
  } else {
    tensor = GuardTorch("libtorch refused it", [&] { return DecodeChecked(bytes, type); });
  }
  if (tensor.ok()) return tensor;
  return absl::InvalidArgumentError(
      absl::StrCat(FieldTypeName(type), " field: ", tensor.status().message()));
}

absl::Status DecodeScalarFieldInto(absl::string_view bytes, FieldType type, const at::Tensor& out) {
  const at::ScalarType want = type == FieldType::kInt ? at::kLong : at::kFloat;
  if ((type != FieldType::kInt && type != FieldType::kFloat) || !out.defined() || out.dim() != 0 ||
      out.scalar_type() != want) {
    return absl::InvalidArgumentError("a scalar field goes into a 0-dim tensor of its type");
  }
  absl::Status status;
  if (static_cast<int64_t>(bytes.size()) > kMaxFieldBytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat(bytes.size(), " bytes, over the limit of ", kMaxFieldBytes));
  } else if (type == FieldType::kInt) {
    absl::StatusOr<int64_t> v = ParseIntText(bytes);
    if (v.ok()) *static_cast<int64_t*>(out.data_ptr()) = *v;
    status = v.status();
  } else {
    absl::StatusOr<float> v = ParseFloatText(bytes);
    if (v.ok()) *static_cast<float*>(out.data_ptr()) = *v;
    status = v.status();
  }
  if (status.ok()) return status;
  return absl::InvalidArgumentError(
      absl::StrCat(FieldTypeName(type), " field: ", status.message()));
}

}  // namespace dtrain

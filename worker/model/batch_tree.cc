#include "worker/model/batch_tree.h"

#include <ATen/ATen.h>

#include <cctype>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {

c10::IValue MapTensors(const c10::IValue& batch,
                       const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (batch.isTensor()) return fn(batch.toTensor());
  if (batch.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : batch.toTupleRef().elements()) {
      items.push_back(MapTensors(item, fn));
    }
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (batch.isList()) {
    c10::impl::GenericList out(batch.toList().elementType());
    for (const c10::IValue& item : batch.toList()) out.push_back(MapTensors(item, fn));
    return out;
  }
  if (batch.isGenericDict()) {
    c10::impl::GenericDict in = batch.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    for (const auto& entry : in) out.insert(entry.key(), MapTensors(entry.value(), fn));
    return out;
  }
  return batch;
}

bool VisitTensors(const c10::IValue& batch, const std::function<bool(const at::Tensor&)>& fn) {
  if (batch.isTensor()) return fn(batch.toTensor());
  if (batch.isTuple()) {
    for (const c10::IValue& item : batch.toTupleRef().elements()) {
      if (!VisitTensors(item, fn)) return false;
    }
    return true;
  }
  if (batch.isList()) {
    for (const c10::IValue& item : batch.toList()) {
      if (!VisitTensors(item, fn)) return false;
    }
    return true;
  }
  if (batch.isGenericDict()) {
    for (const auto& entry : batch.toGenericDict()) {
      if (!VisitTensors(entry.value(), fn)) return false;
    }
  }
  return true;
}

c10::IValue MoveBatchToDevice(const c10::IValue& batch, c10::Device device) {
  // Rebuilt even when every tensor is there already, as Lightning's apply_to_collection does:
  // the step gets containers of its own, and a training_step that pops from its dict batch
  // changes nothing the loop reads after it.
  return MapTensors(batch,
                    [&](const at::Tensor& t) { return t.device() == device ? t : t.to(device); });
}

int64_t BatchSize(const c10::IValue& batch) {
  int64_t size = 0;
  VisitTensors(batch, [&](const at::Tensor& t) {
    size = t.dim() == 0 ? 1 : t.size(0);
    return false;
  });
  return size;
}

absl::StatusOr<std::vector<c10::IValue>> SplitBatch(const c10::IValue& batch, int n) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("cannot split a batch into ", n));
  const int64_t size = BatchSize(batch);
  const bool rows_agree =
      VisitTensors(batch, [&](const at::Tensor& t) { return t.dim() != 0 && t.size(0) == size; });
  if (!rows_agree) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split the batch: its tensors do not all have ", size, " rows in dimension 0"));
  }
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n, size)));
  std::vector<c10::IValue> out;
  for (int i = 0; i < parts; ++i) {
    // torch.chunk's sizes: ceil(size / parts) each, the last smaller.
    const int64_t chunk = (size + parts - 1) / parts;
    const int64_t begin = std::min(size, i * chunk);
    const int64_t end = std::min(size, begin + chunk);
    if (begin >= end && i > 0) break;
    out.push_back(MapTensors(batch, [&](const at::Tensor& t) { return t.slice(0, begin, end); }));
  }
  return out;
}

std::string DescribeBatch(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    std::string dtype = c10::toString(t.scalar_type());
    for (char& c : dtype) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const std::map<std::string, std::string> kPython = {
        {"float", "float32"}, {"double", "float64"}, {"long", "int64"},   {"int", "int32"},
        {"byte", "uint8"},    {"char", "int8"},      {"half", "float16"}, {"short", "int16"}};
    auto it = kPython.find(dtype);
    if (it != kPython.end()) dtype = it->second;
    std::vector<std::string> dims;
    for (int64_t d : t.sizes()) dims.push_back(std::to_string(d));
    return absl::StrCat(dtype, "[", absl::StrJoin(dims, ", "), "]");
  }
  std::vector<std::string> parts;
  if (v.isTuple() || v.isList()) {
    for (const c10::IValue& item :
         v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec()) {
      parts.push_back(DescribeBatch(item));
    }
    return absl::StrCat(v.isTuple() ? "tuple(" : "list(", absl::StrJoin(parts, ", "), ")");
  }
  if (v.isGenericDict()) {
    for (const auto& entry : v.toGenericDict()) {
      parts.push_back(absl::StrCat(entry.key().isString() ? entry.key().toStringRef() : "?", ": ",
                                   DescribeBatch(entry.value())));
    }
    return absl::StrCat("dict(", absl::StrJoin(parts, ", "), ")");
  }
  return v.tagKind();
}

}  // namespace dtrain

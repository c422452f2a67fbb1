// libFuzzer target: bytes as a torch.save file (a zip of data.pkl and storages) through
// ParseTorchSave (worker/model/torch_save_file.h): the zip reader, the pickle gate and
// rewriter (worker/model/pickle_check.h), libtorch's unpickler and the storage and tensor bound
// checks, then every tensor's every element read. A crash, a sanitizer report, a tensor that
// reads outside its storage, or an INTERNAL or UNKNOWN error (an exception nobody expected) is
// a finding.
// Seeds in tests/fuzz/corpus/torch_save/ (tests/fuzz/make_torch_corpus.py): files Python's
// torch.save wrote, and crafted ones (storages shorter than they declare, out-of-range strides
// and offsets, deep nesting, a huge memo index). Built and run by tests/fuzz/run.sh, and for a
// few seconds in every CI run (torch_save_fuzz_check).
#include <cstdint>
#include <cstdlib>
#include <string>

#include <torch/types.h>

#include "tests/fuzz/refused.h"
#include "worker/model/torch_save_file.h"

namespace {

// Reads every element of every tensor `value` holds (a sum in double).
void Touch(const c10::IValue& value, int depth = 0) {
  if (depth > 64) return;
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!dtrain::CheckTensorInStorage(t).ok()) std::abort();
    if (t.numel() > 0 && t.is_floating_point()) (void)t.to(at::kDouble).sum().item<double>();
    if (t.numel() > 0 && !t.is_floating_point() && !t.is_complex()) {
      (void)t.to(at::kLong).sum().item<int64_t>();
    }
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) Touch(v, depth + 1);
  } else if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements()) Touch(v, depth + 1);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      Touch(entry.key(), depth + 1);
      Touch(entry.value(), depth + 1);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<c10::IValue> value = dtrain::ParseTorchSave(bytes, "fuzz.pt");
  if (dtrain::fuzz::Refused(value.status())) return 0;
  Touch(*value);
  return 0;
}

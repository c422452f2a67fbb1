// libFuzzer target: the textual sample fields (worker/data/text_fields.h). The input's first byte
// picks the parser (0: int, 1: float, 2: JSON, 3: UTF-8 check), the rest is the field. A crash,
// a sanitizer report, a non-INVALID_ARGUMENT error, or an accepted value that breaks its
// contract is a finding: an integer that does not print back to the same value, a JSON array
// whose value count is not the product of its shape or that nests deeper than the limit, a UTF-8
// offset beyond the text. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/data/text_fields.h"

namespace {

void CheckError(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      absl::StatusOr<int64_t> v = dtrain::ParseIntText(text);
      if (!v.ok()) return CheckError(v.status()), 0;
      absl::StatusOr<int64_t> again = dtrain::ParseIntText(absl::StrCat(*v));
      if (!again.ok() || *again != *v) std::abort();
      return 0;
    }
    case 1: {
      absl::StatusOr<float> v = dtrain::ParseFloatText(text);
      if (!v.ok()) CheckError(v.status());
      return 0;
    }
    case 2: {
      absl::StatusOr<dtrain::JsonArray> a = dtrain::ParseJsonArray(text);
      if (!a.ok()) return CheckError(a.status()), 0;
      if (a->shape.size() > static_cast<size_t>(dtrain::kJsonMaxDepth)) std::abort();
      uint64_t n = 1;
      for (int64_t d : a->shape) {
        if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) std::abort();
      }
      if (n != a->values.size()) std::abort();
      if (static_cast<int64_t>(n) > dtrain::kJsonMaxElements) std::abort();
      if (a->boolean) {
        for (float v : a->values) {
          if (v != 0.0f && v != 1.0f) std::abort();
        }
      }
      return 0;
    }
    default: {
      std::optional<size_t> at = dtrain::FirstInvalidUtf8(text);
      if (at && *at >= text.size()) std::abort();
      // The prefix before a malformed sequence is itself valid.
      if (at && dtrain::FirstInvalidUtf8(text.substr(0, *at))) std::abort();
      return 0;
    }
  }
}

// The textual WebDataset fields parsed from untrusted bytes into plain values: a `.cls` integer,
// a float, a `.json` number or rectangular nested list of numbers, and the UTF-8 check of a
// `.txt`. Plain C++ (no libtorch), so the fuzz build covers them; worker/data/sample_fields.h
// turns the values into tensors. Messages name what is wrong and quote (escaped, truncated) what
// was found; the caller prefixes the field type, shard and sample.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// An ASCII decimal integer with an optional sign and surrounding ASCII whitespace ("7\n",
// " -3 "). INVALID_ARGUMENT: empty, not a decimal integer, or outside int64.
absl::StatusOr<int64_t> ParseIntText(absl::string_view text);

// An ASCII decimal float ("0.5", "-1e3", "inf", "nan") with surrounding whitespace.
// INVALID_ARGUMENT: empty, not a number, or finite but beyond float32's range.
absl::StatusOr<float> ParseFloatText(absl::string_view text);

inline constexpr int kJsonMaxDepth = 32;
inline constexpr int64_t kJsonMaxElements = int64_t{1} << 20;
inline constexpr int64_t kJsonMaxBytes = int64_t{16} << 20;

// A JSON number, boolean, or nested lists of them of rectangular shape, row-major.
struct JsonArray {
  std::vector<int64_t> shape;  // empty for a scalar
  std::vector<float> values;   // booleans as 0 and 1
  bool boolean = false;        // every leaf was true or false (none were numbers)
};

// INVALID_ARGUMENT: over kJsonMaxBytes, nesting deeper than kJsonMaxDepth or more than
// kJsonMaxElements values (both checked on the raw text, before the parser builds anything),
// not JSON, an object, string or null anywhere, ragged lists, numbers mixed with booleans, or a
// number beyond float32's range.
absl::StatusOr<JsonArray> ParseJsonArray(absl::string_view text);

// The offset of the first byte of `text` that does not begin or continue a well-formed UTF-8
// sequence (overlong forms, surrogates and code points over U+10FFFF are malformed); nullopt
// when `text` is valid UTF-8.
std::optional<size_t> FirstInvalidUtf8(absl::string_view text);

}  // namespace dtrain

#include "worker/data/text_fields.h"

#include <cfloat>
#include <cmath>
#include <string>
#include <system_error>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/charconv.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// At most the first 40 bytes of `s`, escaped, for a message.
std::string Quote(absl::string_view s) {
  constexpr size_t kShown = 40;
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, kShown)), s.size() > kShown ? "'..." : "'");
}

absl::Status OutOfFloat32(double v) {
  return absl::InvalidArgumentError(
      absl::StrCat(v, " is beyond float32's range (largest ", FLT_MAX, ")"));
}

// Nesting depth and an upper bound of the values in a JSON text, read without parsing it: '[' and
// '{' outside strings open a level, and values are at most the commas outside strings plus one.
// Lets ParseJsonArray refuse a hostile text before protobuf's parser recurses into it or builds a
// Value per number.
absl::Status CheckJsonBounds(absl::string_view text) {
  int depth = 0;
  int64_t commas = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > kJsonMaxDepth) {
          return absl::InvalidArgumentError(
              absl::StrCat("JSON nested deeper than ", kJsonMaxDepth, " levels"));
        }
        break;
      case ']':
      case '}':
        --depth;
        break;
      case ',':
        if (++commas >= kJsonMaxElements) {
          return absl::InvalidArgumentError(
              absl::StrCat("JSON with more than ", kJsonMaxElements,
                           " values (store large arrays as a .npy field)"));
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

// Checks `value` against the shape found along the first elements, and appends its leaves.
class JsonFiller {
 public:
  explicit JsonFiller(JsonArray* out) : out_(out) {}

  absl::Status Fill(const google::protobuf::Value& value, size_t depth) {
    const std::vector<int64_t>& shape = out_->shape;
    if (depth < shape.size()) {
      if (value.kind_case() != google::protobuf::Value::kListValue ||
          value.list_value().values_size() != shape[depth]) {
        return Ragged(depth);
      }
      for (const google::protobuf::Value& item : value.list_value().values()) {
        if (absl::Status s = Fill(item, depth + 1); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    switch (value.kind_case()) {
      case google::protobuf::Value::kNumberValue: {
        if (!Leaf(false)) return Mixed();
        const double v = value.number_value();
        if (std::isfinite(v) && std::fabs(v) > FLT_MAX) return OutOfFloat32(v);
        out_->values.push_back(static_cast<float>(v));
        return absl::OkStatus();
      }
      case google::protobuf::Value::kBoolValue:
        if (!Leaf(true)) return Mixed();
        out_->values.push_back(value.bool_value() ? 1.0f : 0.0f);
        return absl::OkStatus();
      case google::protobuf::Value::kListValue:
        return Ragged(depth);
      case google::protobuf::Value::kStructValue:
        return absl::InvalidArgumentError(
            "JSON objects are not decoded into tensors (store each array as a field of its own)");
      case google::protobuf::Value::kStringValue:
        return absl::InvalidArgumentError(
            absl::StrCat("JSON string ", Quote(value.string_value()),
                         " is not a number (text belongs in a .txt field)"));
      default:
        return absl::InvalidArgumentError("JSON null is not a number");
    }
  }

 private:
  // Records the first leaf's kind; false when `boolean` differs from it.
  bool Leaf(bool boolean) {
    if (!seen_leaf_) {
      seen_leaf_ = true;
      out_->boolean = boolean;
    }
    return out_->boolean == boolean;
  }
  absl::Status Mixed() const {
    return absl::InvalidArgumentError("JSON array mixes numbers and booleans");
  }
  absl::Status Ragged(size_t depth) const {
    std::string shape;
    for (int64_t d : out_->shape) absl::StrAppend(&shape, shape.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(
        absl::StrCat("JSON lists are ragged: at nesting level ", depth + 1,
                     " an element differs from the shape (", shape,
                     ") the first elements give (a tensor needs rectangular lists)"));
  }

  JsonArray* out_;
  bool seen_leaf_ = false;
};

}  // namespace

absl::StatusOr<int64_t> ParseIntText(absl::string_view text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return absl::InvalidArgumentError("empty, where an integer was expected");
  size_t i = 0;
  const bool negative = t[0] == '-';
  if (t[0] == '-' || t[0] == '+') ++i;
  if (i == t.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is not a decimal integer"));
  }
  // Accumulated negatively, so that INT64_MIN fits.
  int64_t v = 0;
  for (; i < t.size(); ++i) {
    if (t[i] < '0' || t[i] > '9') {
      return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is not a decimal integer"));
    }
    if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_sub_overflow(v, t[i] - '0', &v)) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is outside int64's range"));
    }
  }
  if (!negative) {
    if (v == INT64_MIN) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is outside int64's range"));
    }
    v = -v;
  }
  return v;
}

absl::StatusOr<float> ParseFloatText(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return absl::InvalidArgumentError("empty, where a number was expected");
  // absl::from_chars takes no '+', which Python's float() does.
  if (t[0] == '+' && t.size() > 1 && t[1] != '-' && t[1] != '+') t.remove_prefix(1);
  // absl::from_chars also reads hexadecimal ("0x1p3"), which is not a decimal number.
  if (t.find_first_of("xXpP") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is not a decimal number"));
  }
  double v = 0;
  const absl::from_chars_result r = absl::from_chars(t.data(), t.data() + t.size(), v);
  if (r.ec == std::errc::invalid_argument || r.ptr != t.data() + t.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is not a decimal number"));
  }
  if (r.ec == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is beyond a double's range"));
  }
  if (std::isfinite(v) && std::fabs(v) > FLT_MAX) return OutOfFloat32(v);
  return static_cast<float>(v);
}

absl::StatusOr<JsonArray> ParseJsonArray(absl::string_view text) {
  if (static_cast<int64_t>(text.size()) > kJsonMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("JSON of ", text.size(),
                                                   " bytes, over the limit of ", kJsonMaxBytes,
                                                   " (store large arrays as a .npy field)"));
  }
  if (absl::Status s = CheckJsonBounds(text); !s.ok()) return s;
  google::protobuf::Value value;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &value);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON: ", std::string(parsed.message().data(), parsed.message().size())));
  }
  JsonArray out;
  // The shape the first elements give; Fill checks every other list against it.
  const google::protobuf::Value* first = &value;
  while (first->kind_case() == google::protobuf::Value::kListValue) {
    out.shape.push_back(first->list_value().values_size());
    if (first->list_value().values_size() == 0) break;
    first = &first->list_value().values(0);
  }
  if (absl::Status s = JsonFiller(&out).Fill(value, 0); !s.ok()) return s;
  return out;
}

std::optional<size_t> FirstInvalidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int length = 0;
    // The range of the second byte, which rules out overlong forms, surrogates and > U+10FFFF.
    unsigned char low = 0x80, high = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0) low = 0xa0;
      if (c == 0xed) high = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0) low = 0x90;
      if (c == 0xf4) high = 0x8f;
    } else {
      return i;
    }
    if (i + length > n) return i;
    if (s[i + 1] < low || s[i + 1] > high) return i;
    for (int k = 2; k < length; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    }
    i += length;
  }
  return std::nullopt;
}

}  // namespace dtrain

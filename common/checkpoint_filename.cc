#include "common/checkpoint_filename.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

constexpr char kDefaultPattern[] = "{epoch}-{step}";

bool IsFileNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '=' ||
         c == '-';
}

struct Field {
  std::string name;
  bool zero = false;
  int width = -1;
  int precision = -1;
  char type = 0;  // d, f, e, g, or 0 for Python's default
};

// A written-by-hand reader of the subset: no C++ library on Debian's list implements Python's
// format mini-language (libfmt's headers are not installed here).
std::optional<Field> ParseField(const std::string& text) {
  Field f;
  const size_t colon = text.find(':');
  f.name = text.substr(0, colon);
  if (f.name.empty()) return std::nullopt;
  for (char c : f.name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.' &&
        c != '/') {
      return std::nullopt;
    }
  }
  if (colon == std::string::npos) return f;
  const std::string spec = text.substr(colon + 1);
  size_t i = 0;
  if (i < spec.size() && spec[i] == '0') {
    f.zero = true;
    ++i;
  }
  auto number = [&](int* out) {
    const size_t start = i;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i])) && i - start < 3) {
      ++i;
    }
    if (i > start) *out = std::stoi(spec.substr(start, i - start));
    return i > start;
  };
  number(&f.width);
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    if (!number(&f.precision)) return std::nullopt;
  }
  if (i < spec.size() && std::string_view("dfeg").find(spec[i]) != std::string_view::npos) {
    f.type = spec[i++];
  }
  if (i != spec.size()) return std::nullopt;
  return f;
}

std::string FormatValue(const Field& f, double value) {
  char format[32];
  char out[128];
  const int width = std::max(f.width, 0);
  if (f.type == 'd' ||
      (f.type == 0 && f.precision < 0 && std::floor(value) == value && std::fabs(value) < 1e15)) {
    std::snprintf(format, sizeof(format), "%%%s*lld", f.zero ? "0" : "");
    std::snprintf(out, sizeof(out), format, width, static_cast<long long>(std::llround(value)));
    return out;
  }
  const char type = f.type == 0 ? 'g' : f.type;
  const int precision = f.precision >= 0 ? f.precision : (f.type == 0 ? 12 : 6);
  std::snprintf(format, sizeof(format), "%%%s*.*%c", f.zero ? "0" : "", type);
  std::snprintf(out, sizeof(out), format, width, precision, value);
  return out;
}

}  // namespace

absl::Status ValidateCheckpointFilename(const std::string& pattern) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.filename '", pattern, "': ", why,
                     " (a template such as \"{epoch}-{val_loss:.2f}\"; docs/jobs.md)"));
  };
  if (pattern.size() > 200) return bad("longer than 200 characters");
  if (pattern == "last") return bad("last.ckpt is the latest checkpoint's own name");
  if (!pattern.empty() && pattern[0] == '.') return bad("a name may not start with '.'");
  if (absl::StrContains(pattern, "..") || absl::StrContains(pattern, "\\")) {
    return bad("'..' and '\\' have no place in a file name");
  }
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '}') return bad("a '}' without its '{'");
    if (c == '{') {
      const size_t close = pattern.find('}', i);
      if (close == std::string::npos) return bad("a '{' without its '}'");
      const std::string field = pattern.substr(i + 1, close - i - 1);
      if (field.find('{') != std::string::npos) return bad("a '{' inside a field");
      if (!ParseField(field).has_value()) {
        return bad(absl::StrCat("cannot read the field {", field,
                                "}: a name, then optionally ':' and a spec such as .2f, 03d, .3e"));
      }
      i = close + 1;
      continue;
    }
    if (!IsFileNameChar(c)) {
      return bad(absl::StrCat("'", std::string(1, c),
                              "' outside a field: a checkpoint's name has letters, digits, '.', "
                              "'_', '=' and '-'"));
    }
    ++i;
  }
  return absl::OkStatus();
}

std::string FormatCheckpointFilename(const std::string& pattern,
                                     const std::map<std::string, double>& values,
                                     bool auto_insert_metric_name) {
  const std::string& p = pattern.empty() ? std::string(kDefaultPattern) : pattern;
  std::string out;
  size_t i = 0;
  while (i < p.size()) {
    const size_t open = p.find('{', i);
    if (open == std::string::npos) {
      out += p.substr(i);
      break;
    }
    out += p.substr(i, open - i);
    const size_t close = p.find('}', open);
    if (close == std::string::npos) break;  // ValidateCheckpointFilename refuses it
    const std::optional<Field> field = ParseField(p.substr(open + 1, close - open - 1));
    if (field.has_value()) {
      auto it = values.find(field->name);
      if (auto_insert_metric_name) absl::StrAppend(&out, field->name, "=");
      out += FormatValue(*field, it == values.end() ? 0.0 : it->second);
    }
    i = close + 1;
  }
  // What the workers accept as a checkpoint's name (SaveCheckpoint): a metric's own name may
  // hold '/' (Lightning's "lr-AdamW/pg1"), and an exponent a '+'.
  for (char& c : out) {
    if (!IsFileNameChar(c)) c = '_';
  }
  return out + ".ckpt";
}

}  // namespace dtrain

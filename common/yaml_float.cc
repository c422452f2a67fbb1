#include "common/yaml_float.h"

#include <charconv>
#include <cmath>

namespace dtrain {
namespace {

template <typename T>
std::string Shortest(T value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char digits[64];
  const std::to_chars_result end = std::to_chars(digits, digits + sizeof(digits), value);
  std::string text(digits, end.ptr);
  // YAML 1.1's float needs a dot before any exponent: "32" is an int, "1e-05" a string.
  if (text.find('.') == std::string::npos) {
    const size_t exponent = text.find('e');
    text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  }
  return text;
}

}  // namespace

std::string YamlFloat(double value) { return Shortest(value); }
std::string YamlFloat(float value) { return Shortest(value); }

}  // namespace dtrain

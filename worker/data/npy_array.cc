#include "worker/data/npy_array.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

absl::Status Invalid(absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("not a readable .npy array: ", reason));
}

// At most the first 40 bytes of `s`, escaped, for a message.
std::string Quote(absl::string_view s) {
  constexpr size_t kShown = 40;
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, kShown)), s.size() > kShown ? "'..." : "'");
}

struct Dtype {
  const char* code;  // kind and size, after the byte order character
  const char* name;
  int64_t bytes;
};
constexpr Dtype kDtypes[] = {
    {"b1", "bool", 1},    {"u1", "uint8", 1},   {"i1", "int8", 1},
    {"i2", "int16", 2},   {"i4", "int32", 4},   {"i8", "int64", 8},
    {"f2", "float16", 2}, {"f4", "float32", 4}, {"f8", "float64", 8},
};

constexpr bool kLittleEndianHost = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
static_assert(kLittleEndianHost, "the .npy reader assumes a little-endian host");

absl::StatusOr<Dtype> DtypeOf(absl::string_view descr) {
  constexpr char kSupported[] =
      "; supported: bool, uint8, int8, int16, int32, int64, float16, float32, float64 (save with "
      "arr.astype(...) first)";
  if (descr.size() < 2)
    return Invalid(absl::StrCat("dtype ", Quote(descr), " is not one numpy writes"));
  const char order = descr[0];
  const absl::string_view code = descr.substr(1);
  for (const Dtype& d : kDtypes) {
    if (code != d.code) continue;
    if (order == '|' || order == '<' || order == '=' || (order == '>' && d.bytes == 1)) {
      if (order == '|' && d.bytes != 1) break;  // '|' means "no byte order": bytes only
      return d;
    }
    if (order == '>') {
      return Invalid(absl::StrCat("dtype ", Quote(descr),
                                  " is big-endian; save it little-endian, e.g. "
                                  "arr.astype(arr.dtype.newbyteorder('<'))"));
    }
    break;
  }
  if (code == "u2" || code == "u4" || code == "u8") {
    return Invalid(absl::StrCat("dtype ", Quote(descr),
                                " is unsigned wider than a byte, which torch has no type for",
                                kSupported));
  }
  if (!code.empty() && code[0] == 'O') {
    return Invalid(absl::StrCat("dtype ", Quote(descr),
                                " holds Python objects, which would need pickle", kSupported));
  }
  return Invalid(absl::StrCat("dtype ", Quote(descr), " is not supported", kSupported));
}

// A cursor over the header's dict literal: the subset of Python literal syntax numpy writes.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::Status Parse(NpyArray* out) {
    SkipSpace();
    if (!Consume('{')) return Error("the header does not start with '{'");
    bool have_descr = false, have_order = false, have_shape = false;
    std::string descr;
    for (;;) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      if (absl::Status s = String(&key); !s.ok()) return s;
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after key '", key, "'"));
      SkipSpace();
      if (key == "descr") {
        if (have_descr) return Error("key 'descr' appears twice");
        have_descr = true;
        if (Peek() != '\'' && Peek() != '"') {
          return Error(
              "'descr' is not a dtype string such as '<f4' (structured arrays are not "
              "supported)");
        }
        if (absl::Status s = String(&descr); !s.ok()) return s;
      } else if (key == "fortran_order") {
        if (have_order) return Error("key 'fortran_order' appears twice");
        have_order = true;
        if (ConsumeWord("True")) {
          out->fortran_order = true;
        } else if (ConsumeWord("False")) {
          out->fortran_order = false;
        } else {
          return Error("'fortran_order' is neither True nor False");
        }
      } else if (key == "shape") {
        if (have_shape) return Error("key 'shape' appears twice");
        have_shape = true;
        if (absl::Status s = Shape(&out->shape); !s.ok()) return s;
      } else {
        return Error(absl::StrCat("unexpected key ", Quote(key),
                                  " (numpy writes only 'descr', 'fortran_order' and 'shape')"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume('}')) break;
      return Error("expected ',' or '}' after a value");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the header's closing '}'");
    if (!have_descr || !have_order || !have_shape) {
      return Error("the header lacks one of 'descr', 'fortran_order' and 'shape'");
    }
    absl::StatusOr<Dtype> dtype = DtypeOf(descr);
    if (!dtype.ok()) return dtype.status();
    out->dtype = dtype->name;
    out->item_bytes = dtype->bytes;
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view reason) const {
    return Invalid(absl::StrCat("header ", reason, " (at byte ", pos_, " of ", Quote(text_), ")"));
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\n')) {
      ++pos_;
    }
  }
  // A quoted string without escapes (numpy's keys and dtype strings have none).
  absl::Status String(std::string* out) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a quoted string");
    ++pos_;
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '\\' || c < 0x20 || c >= 0x7f) return Error("unexpected character in a string");
      ++pos_;
    }
    if (pos_ == text_.size()) return Error("unterminated string");
    *out = std::string(text_.substr(start, pos_ - start));
    ++pos_;
    return absl::OkStatus();
  }
  // A tuple of non-negative integers: (), (3,), (3, 4), (3, 4,).
  absl::Status Shape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("'shape' is not a tuple");
    bool trailing_comma = false;
    for (;;) {
      SkipSpace();
      if (Consume(')')) break;
      if (static_cast<int>(shape->size()) == kNpyMaxDims) {
        return Error(absl::StrCat("'shape' has more than ", kNpyMaxDims, " dimensions"));
      }
      int64_t dim = 0;
      int digits = 0;
      while (Peek() >= '0' && Peek() <= '9') {
        dim = dim * 10 + (text_[pos_++] - '0');
        if (dim > kNpyMaxDim) {
          return Error(absl::StrCat("a dimension of 'shape' exceeds ", kNpyMaxDim));
        }
        ++digits;
      }
      if (digits == 0) return Error("'shape' holds something other than non-negative integers");
      Consume('L');  // Python 2's long literals, in files written by numpy under Python 2
      shape->push_back(dim);
      SkipSpace();
      trailing_comma = Consume(',');
      SkipSpace();
      if (Consume(')')) break;
      if (!trailing_comma) return Error("expected ',' or ')' in 'shape'");
    }
    if (shape->size() == 1 && !trailing_comma) {
      return Error("'shape' is a parenthesized integer, not a tuple (numpy writes (n,))");
    }
    return absl::OkStatus();
  }

  const absl::string_view text_;
  size_t pos_ = 0;
};

uint64_t LittleEndian(absl::string_view s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes) {
  if (bytes.size() < kMagicBytes + 2 || bytes.substr(0, kMagicBytes) != kMagic) {
    return Invalid("it does not start with numpy's magic \\x93NUMPY (write it with numpy.save)");
  }
  const int major = static_cast<unsigned char>(bytes[kMagicBytes]);
  const int minor = static_cast<unsigned char>(bytes[kMagicBytes + 1]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return Invalid(absl::StrCat("format version ", major, ".", minor,
                                " is unknown (1.0, 2.0 and 3.0 are read)"));
  }
  const int length_bytes = major == 1 ? 2 : 4;
  const size_t header_start = kMagicBytes + 2 + length_bytes;
  if (bytes.size() < header_start) return Invalid("the file ends inside the header's length");
  const uint64_t header_bytes = LittleEndian(bytes, kMagicBytes + 2, length_bytes);
  if (header_bytes > static_cast<uint64_t>(kNpyMaxHeaderBytes)) {
    return Invalid(absl::StrCat("the header claims ", header_bytes, " bytes, over the limit of ",
                                kNpyMaxHeaderBytes));
  }
  if (header_bytes > bytes.size() - header_start) {
    return Invalid(absl::StrCat("the header claims ", header_bytes, " bytes but only ",
                                bytes.size() - header_start, " follow"));
  }
  NpyArray array;
  if (absl::Status s = HeaderParser(bytes.substr(header_start, header_bytes)).Parse(&array);
      !s.ok()) {
    return s;
  }
  // The element count, with overflow checked; a zero dimension makes it 0 whatever the others.
  uint64_t elements = 1;
  bool overflow = false;
  for (int64_t dim : array.shape) {
    if (dim == 0) {
      elements = 0;
      overflow = false;
      break;
    }
    if (!overflow)
      overflow = __builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements);
  }
  uint64_t needed = 0;
  if (!overflow) {
    overflow = __builtin_mul_overflow(elements, static_cast<uint64_t>(array.item_bytes), &needed);
  }
  const absl::string_view data = bytes.substr(header_start + header_bytes);
  const std::string shape = absl::StrCat("(", absl::StrJoin(array.shape, ", "), ")");
  if (overflow) {
    return Invalid(absl::StrCat("shape ", shape, " of ", array.dtype,
                                " has more elements than can be addressed"));
  }
  if (needed != data.size()) {
    return Invalid(absl::StrCat("shape ", shape, " of ", array.dtype, " needs ", needed,
                                " bytes of data but the file has ", data.size()));
  }
  array.data = data;
  return array;
}

}  // namespace dtrain

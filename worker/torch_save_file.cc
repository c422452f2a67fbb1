#include "worker/torch_save_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/istream_adapter.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/serialize.h>

#include "absl/strings/str_cat.h"
#include "worker/torch_status.h"

namespace dtrain {
namespace {

// Reads little-endian unsigned integers of `n` bytes.
uint64_t LittleEndian(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// An in-memory source for PyTorchStreamReader.
class StringAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit StringAdapter(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

}  // namespace

std::string WithoutSingleItemOpcodes(const std::string& p) {
  static_assert(sizeof(char) == 1);
  // Walks the opcodes keeping, for each stack item, the offset where the opcodes that made it
  // begin; a MARK is an item of its own. Only SETITEM's key offset matters in the end.
  constexpr int64_t kMark = -1;
  struct Item {
    size_t start;
    int64_t kind;  // kMark or 0
  };
  std::vector<Item> stack;
  std::vector<size_t> insert_mark_at;               // before these offsets
  std::vector<std::pair<size_t, char>> replace_at;  // opcode offset, its MARK-taking form
  auto pop_to_mark = [&]() -> std::optional<size_t> {
    while (!stack.empty() && stack.back().kind != kMark) stack.pop_back();
    if (stack.empty()) return std::nullopt;
    const size_t start = stack.back().start;
    stack.pop_back();
    return start;
  };
  auto pop_n = [&](size_t n) -> std::optional<size_t> {
    if (stack.size() < n) return std::nullopt;
    const size_t start = stack[stack.size() - n].start;
    stack.resize(stack.size() - n);
    return start;
  };
  size_t i = 0;
  bool stopped = false;
  while (i < p.size() && !stopped) {
    const size_t at = i;
    const unsigned char op = static_cast<unsigned char>(p[i++]);
    auto need = [&](size_t n) { return i + n <= p.size(); };
    auto push = [&](size_t start) { stack.push_back({start, 0}); };
    switch (op) {
      case 0x80:  // PROTO
        if (!need(1)) return p;
        i += 1;
        break;
      case '.':  // STOP
        stopped = true;
        break;
      case '(':  // MARK
        stack.push_back({at, kMark});
        break;
      case '}':   // EMPTY_DICT
      case ']':   // EMPTY_LIST
      case ')':   // EMPTY_TUPLE
      case 'N':   // NONE
      case 0x88:  // NEWTRUE
      case 0x89:  // NEWFALSE
        push(at);
        break;
      case 'K':  // BININT1
      case 'h':  // BINGET
        if (!need(1)) return p;
        i += 1;
        push(at);
        break;
      case 'M':  // BININT2
        if (!need(2)) return p;
        i += 2;
        push(at);
        break;
      case 'J':  // BININT
      case 'j':  // LONG_BINGET
        if (!need(4)) return p;
        i += 4;
        push(at);
        break;
      case 'G':  // BINFLOAT
        if (!need(8)) return p;
        i += 8;
        push(at);
        break;
      case 0x8a:  // LONG1
      case 'U':   // SHORT_BINSTRING
      case 'C':   // SHORT_BINBYTES
        if (!need(1)) return p;
        i += 1 + static_cast<unsigned char>(p[i]);
        if (i > p.size()) return p;
        push(at);
        break;
      case 0x8b:  // LONG4
      case 'X':   // BINUNICODE
      case 'T':   // BINSTRING
      case 'B':   // BINBYTES
        if (!need(4)) return p;
        i += 4 + LittleEndian(p, i, 4);
        if (i > p.size()) return p;
        push(at);
        break;
      case 'q':  // BINPUT
        if (!need(1)) return p;
        i += 1;
        break;
      case 'r':  // LONG_BINPUT
        if (!need(4)) return p;
        i += 4;
        break;
      case 'c': {  // GLOBAL module\nname\n
        const size_t first = p.find('\n', i);
        const size_t second = first == std::string::npos ? first : p.find('\n', first + 1);
        if (second == std::string::npos) return p;
        i = second + 1;
        push(at);
        break;
      }
      case 0x85:    // TUPLE1
      case 'Q':     // BINPERSID
      case 0x86:    // TUPLE2
      case 0x87:    // TUPLE3
      case 'R':     // REDUCE
      case 0x81: {  // NEWOBJ
        const size_t n = op == 0x87 ? 3 : (op == 0x85 || op == 'Q') ? 1 : 2;
        std::optional<size_t> start = pop_n(n);
        if (!start) return p;
        push(*start);
        break;
      }
      case 't':    // TUPLE
      case 'l':    // LIST
      case 'd': {  // DICT
        std::optional<size_t> start = pop_to_mark();
        if (!start) return p;
        push(*start);
        break;
      }
      case 'b':  // BUILD: the state goes into the object below it
        if (!pop_n(1)) return p;
        break;
      case 'a': {  // APPEND: the item goes into the list below it
        if (stack.size() < 2) return p;
        insert_mark_at.push_back(stack.back().start);
        replace_at.push_back({at, 'e'});
        stack.pop_back();
        break;
      }
      case 'e':  // APPENDS
      case 'u':  // SETITEMS
        if (!pop_to_mark()) return p;
        break;
      case 's': {  // SETITEM: key and value go into the dict below them
        if (stack.size() < 3) return p;
        insert_mark_at.push_back(stack[stack.size() - 2].start);
        replace_at.push_back({at, 'u'});
        stack.resize(stack.size() - 2);
        break;
      }
      default:
        return p;  // an opcode torch.save's protocol 2 does not use
    }
  }
  if (replace_at.empty()) return p;
  std::vector<size_t> marks = insert_mark_at;
  std::sort(marks.begin(), marks.end());
  std::string out;
  out.reserve(p.size() + marks.size());
  size_t next_mark = 0;
  for (size_t k = 0; k < p.size(); ++k) {
    while (next_mark < marks.size() && marks[next_mark] == k) {
      out.push_back('(');
      ++next_mark;
    }
    out.push_back(p[k]);
  }
  // SETITEM -> SETITEMS, APPEND -> APPENDS at the shifted offsets: each mark inserted at or
  // before an offset moves it by one.
  for (const auto& [at, op] : replace_at) {
    const size_t shift = std::upper_bound(marks.begin(), marks.end(), at) - marks.begin();
    out[at + shift] = op;
  }
  return out;
}

absl::StatusOr<c10::IValue> ParseTorchSave(const std::string& bytes, const std::string& origin) {
  if (bytes.size() < 4 || bytes.compare(0, 2, "PK") != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", origin,
                     "' is not a file written by torch.save (a zip archive); write it with "
                     "torch.save(obj, path) from torch >= 1.6"));
  }
  return GuardTorch(
      absl::StrCat("cannot read '", origin, "' as a torch.save file"),
      [&]() -> absl::StatusOr<c10::IValue> {
        caffe2::serialize::PyTorchStreamReader reader(std::make_shared<StringAdapter>(bytes));
        at::DataPtr pickle_data;
        size_t pickle_size = 0;
        std::tie(pickle_data, pickle_size) = reader.getRecord("data.pkl");
        const std::string pickle = WithoutSingleItemOpcodes(
            std::string(static_cast<const char*>(pickle_data.get()), pickle_size));
        size_t offset = 0;
        auto read = [&](char* buffer, size_t n) -> size_t {
          n = std::min(n, pickle.size() - offset);
          std::memcpy(buffer, pickle.data() + offset, n);
          offset += n;
          return n;
        };
        auto read_record = [&](const std::string& name) {
          return std::get<0>(reader.getRecord("data/" + name));
        };
        torch::jit::Unpickler unpickler(read, nullptr, nullptr, read_record, c10::nullopt);
        unpickler.set_version(reader.version());
        return unpickler.parse_ivalue();
      });
}

absl::StatusOr<c10::IValue> ReadTorchSaveFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    return absl::NotFoundError(absl::StrCat("'", path, "' does not exist or cannot be read"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  return ParseTorchSave(bytes.str(), path);
}

absl::Status WriteTorchSaveFile(const std::string& path, const c10::IValue& value) {
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
  absl::Status status =
      GuardTorch(absl::StrCat("cannot write '", path, "'"), [&]() -> absl::Status {
        const std::vector<char> bytes = torch::pickle_save(value);
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        out.close();
        if (!out) {
          return absl::InvalidArgumentError(
              absl::StrCat("cannot write '", temporary, "': ", std::strerror(errno)));
        }
        return absl::OkStatus();
      });
  if (!status.ok()) {
    std::remove(temporary.c_str());
    return status;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("cannot move '", temporary, "' into place at '", path, "': ", reason));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

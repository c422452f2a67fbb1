#include "worker/model/torch_save_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/istream_adapter.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/serialize.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "worker/model/pickle_check.h"
#include "worker/model/torch_status.h"

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

// Keys of the entries the rewrite adds to stand in for what libtorch cannot unpickle; removed
// from every dict after unpickling (RemoveJunk).
// Short, since each OrderedDict in a pickle costs one or two of them in the rewritten pickle.
constexpr const char* kJunkKeys[] = {"\x01dtc", "\x01dta", "\x01dts"};

// The first item of the list a neutral object becomes (WithoutSingleItemOpcodes).
constexpr char kNeutralMarker[] = "\x01dto";

// BINUNICODE of `s`.
std::string PickledString(const std::string& s) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xff));
  return out + s;
}

// Bytes per element of a torch.save storage type ("torch.FloatStorage"); 0 for another.
uint64_t StorageElementBytes(const std::string& type) {
  static const std::map<std::string, uint64_t> kBytes = {
      {"torch.DoubleStorage", 8},       {"torch.FloatStorage", 4},
      {"torch.HalfStorage", 2},         {"torch.BFloat16Storage", 2},
      {"torch.LongStorage", 8},         {"torch.IntStorage", 4},
      {"torch.ShortStorage", 2},        {"torch.CharStorage", 1},
      {"torch.ByteStorage", 1},         {"torch.BoolStorage", 1},
      {"torch.ComplexFloatStorage", 8}, {"torch.ComplexDoubleStorage", 16},
  };
  auto it = kBytes.find(type);
  return it == kBytes.end() ? 0 : it->second;
}

// Every tensor in `root` lies inside its storage (non-negative offset and strides, its last
// element within the storage's bytes). Walks without recursion, each container once (a pickle
// may share or even cycle them).
absl::Status CheckTensorViews(const c10::IValue& root) {
  std::vector<c10::IValue> todo = {root};
  std::set<const void*> seen;
  while (!todo.empty()) {
    c10::IValue v = std::move(todo.back());
    todo.pop_back();
    if (v.isTensor()) {
      if (absl::Status s = CheckTensorInStorage(v.toTensor()); !s.ok()) return s;
      continue;
    }
    if (!v.isList() && !v.isTuple() && !v.isGenericDict()) continue;
    if (!seen.insert(v.internalToPointer()).second) continue;
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) todo.push_back(e);
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) todo.push_back(e);
    } else {
      for (const auto& e : v.toGenericDict()) {
        todo.push_back(e.key());
        todo.push_back(e.value());
      }
    }
  }
  return absl::OkStatus();
}

void RemoveJunk(const c10::IValue& value) {
  if (value.isList()) {
    // A neutral object: emptied, which also breaks the cycles such objects can form (a
    // scheduler whose bound anneal_func refers back to it).
    c10::List<c10::IValue> list = value.toList();
    if (!list.empty() && list.get(0).isString() && list.get(0).toStringRef() == kNeutralMarker) {
      list.clear();
      return;
    }
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict dict = value.toGenericDict();
    for (const char* key : kJunkKeys) (void)dict.erase(c10::IValue(std::string(key)));
    for (const auto& entry : dict) RemoveJunk(entry.value());
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toList()) RemoveJunk(item);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) RemoveJunk(item);
  }
}

}  // namespace

std::string WithoutSingleItemOpcodes(const std::string& p) {
  static_assert(sizeof(char) == 1);
  // Offsets fit 29 bits so that an item and an insertion pack into 4 bytes each: the walk's
  // memory stays a small multiple of the pickle (issue 38). A larger data.pkl is left as it is,
  // and CheckPickle's bounds then decide.
  constexpr size_t kMaxPickle = size_t{1} << 29;
  if (p.size() >= kMaxPickle) return p;
  // Walks the opcodes keeping, for each stack item, the offset where the opcodes that made it
  // begin and its kind; a MARK is an item of its own. Only SETITEM's key offset matters in the
  // end.
  enum Kind : uint32_t {
    kPlain = 0,
    kOrderedDictClass = 1,  // GLOBAL collections.OrderedDict
    kOrderedDict = 2,       // an instance: REDUCE of that class
    // Any other class that is not a tensor's, its storage's or a dtype (an lr scheduler's bound
    // anneal_func, a Counter, a pickled optimizer, a Parameter inside one): libtorch refuses it.
    // Its GLOBAL becomes a marker string and an instance a list [marker, args, state...],
    // emptied after unpickling (RemoveJunk): a list, not a dict, because such objects can be the
    // keys of a pickled optimizer's state.
    kNeutralClass = 3,
    kNeutral = 4,
    kMark = 7,
  };
  struct Item {
    uint32_t start : 29;
    uint32_t kind : 3;
  };
  // What is inserted before an offset (in the order recorded: inner constructs first).
  enum What : uint32_t {
    kInsertMark = 0,         // (
    kInsertListMark = 1,     // ](
    kInsertDictJunk = 2,     // }( junk0
    kInsertArgsJunk = 3,     // junk1
    kInsertStateJunk = 4,    // ( junk2
    kInsertNeutralName = 5,  // the marker string, for an erased GLOBAL
  };
  struct Insert {
    uint32_t at : 29;
    uint32_t what : 3;
  };
  static const std::string* const kTexts =
      new std::string[6]{"(",
                         "](",
                         absl::StrCat("}(", PickledString(kJunkKeys[0])),
                         PickledString(kJunkKeys[1]),
                         absl::StrCat("(", PickledString(kJunkKeys[2])),
                         PickledString(kNeutralMarker)};
  std::vector<uint8_t> memo_kind;  // what each PUT index stored, for GET
  std::vector<Item> stack;
  std::vector<Insert> inserts;
  std::vector<std::pair<uint32_t, uint32_t>> erases;  // [begin, end) of opcodes dropped
  // The pickle with opcodes replaced by another of one byte, made on the first replacement.
  std::string edited;
  auto replace = [&](size_t at, char op) {
    if (edited.empty()) edited = p;
    edited[at] = op;
  };
  auto insert = [&](size_t at, What what) {
    inserts.push_back({static_cast<uint32_t>(at), static_cast<uint32_t>(what)});
  };
  auto push = [&](size_t start, uint32_t kind = kPlain) {
    stack.push_back({static_cast<uint32_t>(start), kind});
  };
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
    switch (op) {
      case 0x80:  // PROTO
        if (!need(1)) return p;
        i += 1;
        break;
      case '.':  // STOP
        stopped = true;
        break;
      case '(':  // MARK
        push(at, kMark);
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
        if (!need(1)) return p;
        i += 1;
        push(at);
        break;
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        const int n = op == 'h' ? 1 : 4;
        if (!need(n)) return p;
        const uint64_t index = LittleEndian(p, i, n);
        i += n;
        push(at, index < memo_kind.size() ? uint32_t{memo_kind[index]} : uint32_t{kPlain});
        break;
      }
      case 'M':  // BININT2
        if (!need(2)) return p;
        i += 2;
        push(at);
        break;
      case 'J':  // BININT
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
      case 'q':    // BINPUT
      case 'r': {  // LONG_BINPUT
        const int n = op == 'q' ? 1 : 4;
        if (!need(n) || stack.empty()) return p;
        const uint64_t index = LittleEndian(p, i, n);
        // A well-formed pickle numbers its PUTs from 0, so an index is below its length; a
        // larger one is left for CheckPickle to refuse, rather than sizing memory by it.
        if (index >= p.size()) return p;
        if (stack.back().kind != kPlain || index < memo_kind.size()) {
          if (index >= memo_kind.size()) memo_kind.resize(index + 1, kPlain);
          memo_kind[index] = static_cast<uint8_t>(stack.back().kind);
        }
        i += n;
        break;
      }
      case 'c': {  // GLOBAL module\nname\n
        const size_t first = p.find('\n', i);
        const size_t second = first == std::string::npos ? first : p.find('\n', first + 1);
        if (second == std::string::npos) return p;
        const absl::string_view module(p.data() + i, first - i);
        const absl::string_view name(p.data() + first + 1, second - first - 1);
        // OrderedDict, and what is not a tensor, its storage or a dtype (an lr scheduler's
        // bound anneal_func, a Counter, an optimizer object, any Python class): libtorch makes
        // None of an OrderedDict and refuses the others. They become dicts whose contents are
        // dropped after unpickling.
        const bool ordered_dict = module == "collections" && name == "OrderedDict";
        // Kept: what libtorch builds as data (pickle_check.h's list), and tensors it cannot
        // build (torch < 1.6's v1, subclasses), which CheckPickle then refuses by name rather
        // than letting a tensor vanish. Every other class (a dtype, torch.Size, any Python
        // object, a TorchScript class) becomes inert data that nothing constructs.
        const bool tensor_rebuilder =
            module == "torch._tensor" ||
            (module == "torch._utils" && absl::StartsWith(name, "_rebuild_tensor"));
        const bool neutral =
            !ordered_dict && !tensor_rebuilder && !IsConstructedGlobal(module, name);
        i = second + 1;
        push(at, ordered_dict ? kOrderedDictClass : neutral ? kNeutralClass : kPlain);
        if (neutral) {
          erases.emplace_back(static_cast<uint32_t>(at), static_cast<uint32_t>(i));
          insert(at, kInsertNeutralName);
        }
        break;
      }
      case 0x85:    // TUPLE1
      case 'Q':     // BINPERSID
      case 0x86:    // TUPLE2
      case 0x87:    // TUPLE3
      case 'R':     // REDUCE
      case 0x81: {  // NEWOBJ
        const size_t n = op == 0x87 ? 3 : (op == 0x85 || op == 'Q') ? 1 : 2;
        const bool makes_ordered_dict =
            op == 'R' && stack.size() >= 2 && stack[stack.size() - 2].kind == kOrderedDictClass;
        const bool makes_neutral = (op == 'R' || op == 0x81) && stack.size() >= 2 &&
                                   stack[stack.size() - 2].kind == kNeutralClass;
        if (makes_neutral) {  // `class args REDUCE` becomes `EMPTY_LIST MARK None args APPENDS`
          insert(stack[stack.size() - 2].start, kInsertListMark);
          replace(at, 'e');
        }
        if (makes_ordered_dict) {
          // libtorch turns OrderedDict() into None. `class args REDUCE` becomes
          // `EMPTY_DICT MARK junk1 class junk2 args SETITEMS`: a dict, whose two entries that
          // hold the class and its arguments are removed after unpickling.
          insert(stack[stack.size() - 2].start, kInsertDictJunk);
          insert(stack.back().start, kInsertArgsJunk);
          replace(at, 'u');
        }
        std::optional<size_t> start = pop_n(n);
        if (!start) return p;
        push(*start, makes_ordered_dict ? kOrderedDict : makes_neutral ? kNeutral : kPlain);
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
        // An OrderedDict's state is its attributes (a module state_dict's _metadata), which
        // libtorch cannot set on a dict (and it has no POP): `state BUILD` becomes
        // `MARK junk3 state SETITEMS`, an entry removed after unpickling.
        if (stack.size() >= 2 && stack[stack.size() - 2].kind == kOrderedDict) {
          insert(stack.back().start, kInsertStateJunk);
          replace(at, 'u');
        }
        if (stack.size() >= 2 && stack[stack.size() - 2].kind == kNeutral) {
          insert(stack.back().start, kInsertMark);
          replace(at, 'e');
        }
        if (!pop_n(1)) return p;
        break;
      case 'a': {  // APPEND: the item goes into the list below it
        if (stack.size() < 2) return p;
        insert(stack.back().start, kInsertMark);
        replace(at, 'e');
        stack.pop_back();
        break;
      }
      case 'e':  // APPENDS
      case 'u':  // SETITEMS
        if (!pop_to_mark()) return p;
        // Items set on a neutral object (a defaultdict's) are appended to its list.
        if (op == 'u' && !stack.empty() && stack.back().kind == kNeutral) replace(at, 'e');
        break;
      case 's': {  // SETITEM: key and value go into the dict below them
        if (stack.size() < 3) return p;
        insert(stack[stack.size() - 2].start, kInsertMark);
        replace(at, stack[stack.size() - 3].kind == kNeutral ? 'e' : 'u');
        stack.resize(stack.size() - 2);
        break;
      }
      case '0': {  // POP
        // Python's pickler writes `POP BINGET n` when an object reached itself while it was
        // reduced (an lr scheduler's bound anneal_func): the copy on the stack is swapped for
        // the memoized one. libtorch has no POP; both are the same neutral object to us, so
        // the pair goes and the copy stays.
        if (stack.empty() || !need(2)) return p;
        const unsigned char next = static_cast<unsigned char>(p[i]);
        const size_t length = next == 'h' ? 2 : next == 'j' ? 5 : 0;
        if (length == 0 || !need(length)) return p;
        erases.emplace_back(static_cast<uint32_t>(at), static_cast<uint32_t>(i + length));
        i += length;
        break;
      }
      default:
        return p;  // an opcode torch.save's protocol 2 does not use
    }
  }
  // The walk's own memory goes before the output is built.
  std::vector<Item>().swap(stack);
  std::vector<uint8_t>().swap(memo_kind);
  if (edited.empty() && inserts.empty() && erases.empty()) return p;
  const std::string& source = edited.empty() ? p : edited;
  // At one offset, constructs recorded later enclose earlier ones, so their bytes go first.
  std::stable_sort(inserts.begin(), inserts.end(),
                   [](const Insert& a, const Insert& b) { return a.at < b.at; });
  size_t out_size = source.size();
  for (const Insert& in : inserts) out_size += kTexts[in.what].size();
  std::string out;
  out.reserve(out_size);
  size_t next = 0;        // the next insertion
  size_t next_erase = 0;  // erases are recorded in the order of their offsets
  size_t copied = 0;      // source bytes before this have been dealt with
  while (copied < source.size()) {
    // Up to the next offset where something happens, bytes are copied whole.
    size_t until = source.size();
    if (next < inserts.size()) until = std::min<size_t>(until, inserts[next].at);
    if (next_erase < erases.size()) until = std::min<size_t>(until, erases[next_erase].first);
    if (until > copied) {
      out.append(source, copied, until - copied);
      copied = until;
      continue;
    }
    size_t end = next;
    while (end < inserts.size() && inserts[end].at == copied) ++end;
    for (size_t e = end; e > next; --e) out += kTexts[inserts[e - 1].what];
    next = end;
    if (next_erase < erases.size() && erases[next_erase].first == copied) {
      // The range is skipped; inserts recorded inside it (none are) come out in record order.
      copied = std::max<size_t>(copied + 1, erases[next_erase].second);
      ++next_erase;
      while (next < inserts.size() && inserts[next].at < copied) {
        out += kTexts[inserts[next].what];
        ++next;
      }
    } else {
      out.push_back(source[copied]);
      ++copied;
    }
  }
  for (; next < inserts.size(); ++next) out += kTexts[inserts[next].what];
  return out;
}

absl::Status CheckTensorInStorage(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.numel() == 0) return absl::OkStatus();
  uint64_t last = 0;
  bool ok = t.storage_offset() >= 0;
  if (ok) last = static_cast<uint64_t>(t.storage_offset());
  for (int64_t d = 0; ok && d < t.dim(); ++d) {
    const int64_t stride = t.stride(d);
    const uint64_t span = static_cast<uint64_t>(t.size(d) - 1);
    ok = stride >= 0 && last <= (uint64_t{1} << 62) &&
         (stride == 0 || span <= ((uint64_t{1} << 62) - last) / static_cast<uint64_t>(stride));
    if (ok) last += span * static_cast<uint64_t>(stride);
  }
  const uint64_t element = static_cast<uint64_t>(t.element_size());
  if (!ok || last + 1 > t.storage().nbytes() / element) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor of sizes ", c10::str(t.sizes()), ", strides ", c10::str(t.strides()),
                     " and offset ", t.storage_offset(), " reaches beyond its storage of ",
                     t.storage().nbytes(), " bytes"));
  }
  return absl::OkStatus();
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
        // torch.jit.save's archives have the same layout plus code: refused before anything in
        // them is read, so no TorchScript __setstate__ ever runs on data.
        for (const std::string& record : reader.getAllRecords()) {
          if (absl::StartsWith(record, "code/") || record == "constants.pkl") {
            return absl::InvalidArgumentError(absl::StrCat(
                "'", origin, "' is a TorchScript archive (it holds ", record,
                "): data and checkpoints are read only as torch.save files and are never run "
                "as code; write it with torch.save(obj, path)"));
          }
        }
        at::DataPtr pickle_data;
        size_t pickle_size = 0;
        std::tie(pickle_data, pickle_size) = reader.getRecord("data.pkl");
        const std::string pickle = WithoutSingleItemOpcodes(
            std::string(static_cast<const char*>(pickle_data.get()), pickle_size));
        // libtorch's unpickler trusts its input: a malformed pickle never reaches it.
        std::vector<PickledStorage> storages;
        if (absl::Status s = CheckPickle(pickle, kMaxPickleDepth, &storages); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "'", origin, "' is not a torch.save file dtrain reads: its data.pkl has a ",
              s.message()));
        }
        // What each storage declares, which its record must hold: libtorch sizes the storage
        // by the declaration and reads the record's bytes.
        std::map<std::string, uint64_t> declared;
        for (const PickledStorage& st : storages) {
          const uint64_t element = StorageElementBytes(st.type);
          if (element == 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("'", origin, "': storage type ", st.type, " is not one dtrain reads"));
          }
          if (st.numel > (uint64_t{1} << 62) / element) {
            return absl::InvalidArgumentError(absl::StrCat("'", origin, "': storage ", st.key,
                                                           " declares ", st.numel, " elements"));
          }
          uint64_t& bytes = declared[st.key];
          bytes = std::max(bytes, st.numel * element);
        }
        size_t offset = 0;
        auto read = [&](char* buffer, size_t n) -> size_t {
          n = std::min(n, pickle.size() - offset);
          std::memcpy(buffer, pickle.data() + offset, n);
          offset += n;
          return n;
        };
        auto read_record = [&](const std::string& name) {
          at::DataPtr data;
          size_t size = 0;
          std::tie(data, size) = reader.getRecord("data/" + name);
          auto it = declared.find(name);
          TORCH_CHECK(it != declared.end(), "storage '", name, "' is not declared by the pickle");
          TORCH_CHECK(it->second <= size, "storage '", name, "' declares ", it->second,
                      " bytes but its record holds ", size);
          return data;
        };
        // Every storage on the CPU, whatever device its file names (torch.load's
        // map_location="cpu"): a file written on cuda:k loads on a CPU-only worker, and each
        // rank then moves what it needs to its own device rather than to cuda:k.
        torch::jit::Unpickler unpickler(read, nullptr, nullptr, read_record,
                                        c10::Device(c10::kCPU));
        unpickler.set_version(reader.version());
        c10::IValue value = unpickler.parse_ivalue();
        // libtorch sets each tensor's sizes, strides and offset without checking them against
        // its storage: checked before anything reads a tensor.
        if (absl::Status s = CheckTensorViews(value); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("'", origin, "': ", s.message()));
        }
        RemoveJunk(value);
        return value;
      });
}

namespace {

// `value` with every list a list of Any and every dict's values Any, its elements likewise:
// libtorch's pickler writes a list of ints, floats, bools or tensors as a call of
// torch.jit._pickle.build_*list, which torch.load's weights_only unpickler refuses (the default
// since torch 2.6); a list of Any is a plain pickle list. Values are shared, not copied: a
// tensor stays the same tensor.
c10::IValue Untyped(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    const c10::List<c10::IValue> in = value.toList();
    out.reserve(in.size());
    for (const c10::IValue& item : in) out.push_back(Untyped(item));
    return out;
  }
  if (value.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> in = value.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), c10::AnyType::get());
    out.reserve(in.size());
    for (const auto& entry : in) out.insert(entry.key(), Untyped(entry.value()));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(Untyped(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

// torch::pickle_save without its type tags: it wraps every list and dict in
// torch.jit._pickle.restore_type_tag, which weights_only loading refuses too. The archive is
// pickle_save's own (data.pkl and a record per storage, written by libtorch's writer).
std::vector<char> PickleSaveUntagged(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* at, size_t n) { pickle.insert(pickle.end(), at, at + n); }, nullptr, nullptr,
      nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  archive.reserve(pickle.size());
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* at, size_t n) {
    const char* bytes = static_cast<const char*>(at);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

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
  std::vector<char> bytes;
  DTRAIN_RETURN_IF_ERROR(GuardTorch(absl::StrCat("cannot write '", path, "'"), [&]() {
    bytes = PickleSaveUntagged(Untyped(value));
    return absl::OkStatus();
  }));
  // Readable by others as before: a shared checkpoint.dirpath is the operator's to share.
  absl::Status written =
      WriteFileAtomically(path, absl::string_view(bytes.data(), bytes.size()), 0644);
  if (!written.ok()) return absl::InvalidArgumentError(written.message());
  return absl::OkStatus();
}

}  // namespace dtrain

#include "worker/model/pickle_check.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// What the walk keeps per stack item: how deeply it nests containers (an atom 0), and for the
// pieces of a persistent id (short strings, ints, a GLOBAL's name, a tuple of those) the value.
struct Item {
  enum Kind { kOther, kString, kInt, kGlobal, kTuple };
  int depth = 0;
  Kind kind = kOther;
  std::string text;
  uint64_t number = 0;
  std::vector<Item> items;
  // A 2-tuple whose second item is a short string: what restore_type_tag takes (a value and
  // the type string libtorch's type parser reads, recursively, so its length is bounded).
  bool value_and_short_string = false;
};

constexpr char kTypeTagGlobal[] = "torch.jit._pickle.restore_type_tag";

class Walk {
 public:
  Walk(absl::string_view p, int max_depth, std::vector<PickledStorage>* storages)
      : p_(p), max_depth_(max_depth), storages_(storages) {}

  absl::Status Run() {
    while (at_ < p_.size()) {
      start_ = at_;
      op_ = static_cast<unsigned char>(p_[at_++]);
      bool stop = false;
      if (absl::Status s = Step(&stop); !s.ok()) return s;
      if (stop) return absl::OkStatus();
    }
    return Bad("the pickle ends without STOP");
  }

 private:
  absl::Status Bad(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat("malformed pickle at byte ", start_,
                                                   " (opcode 0x", absl::Hex(op_), "): ", why));
  }

  // Bytes of an argument, inside the input.
  bool Take(uint64_t n, absl::string_view* out = nullptr) {
    if (n > p_.size() - at_) return false;
    if (out != nullptr) *out = p_.substr(at_, n);
    at_ += n;
    return true;
  }
  bool Little(int n, uint64_t* out) {
    absl::string_view b;
    if (!Take(n, &b)) return false;
    *out = 0;
    for (int i = n - 1; i >= 0; --i) *out = (*out << 8) | static_cast<unsigned char>(b[i]);
    return true;
  }
  // A GLOBAL's "module\nname\n" line.
  bool Line() {
    const size_t end = p_.find('\n', at_);
    if (end == absl::string_view::npos || end - at_ > 1024) return false;
    at_ = end + 1;
    return true;
  }

  size_t Base() const { return marks_.empty() ? 0 : marks_.back(); }
  bool Has(size_t n) const { return stack_.size() - Base() >= n; }
  absl::Status Push(Item item) {
    if (item.depth > max_depth_) {
      return Bad(absl::StrCat("values nest deeper than ", max_depth_, " levels"));
    }
    stack_.push_back(std::move(item));
    return absl::OkStatus();
  }
  absl::Status Push(int depth) {
    Item item;
    item.depth = depth;
    return Push(std::move(item));
  }
  absl::Status PushAtom(Item::Kind kind, std::string text = "", uint64_t number = 0) {
    Item item;
    item.kind = kind;
    item.text = std::move(text);
    item.number = number;
    return Push(std::move(item));
  }
  // The deepest of the top `n` items, popped; with `into`, the items themselves, in order.
  int Pop(size_t n, std::vector<Item>* into = nullptr) {
    int deepest = 0;
    if (into != nullptr) into->assign(stack_.end() - n, stack_.end());
    for (size_t i = 0; i < n; ++i) {
      deepest = std::max(deepest, stack_.back().depth);
      stack_.pop_back();
    }
    return deepest;
  }
  // A tuple of its items when they are all atoms (a persistent id's pieces), else a container.
  absl::Status PushTuple(std::vector<Item> items, int deepest) {
    Item tuple;
    tuple.depth = deepest + 1;
    tuple.value_and_short_string = items.size() == 2 && items[1].kind == Item::kString;
    bool atoms = items.size() <= 8;
    for (const Item& i : items) atoms = atoms && i.kind != Item::kOther && i.kind != Item::kTuple;
    if (atoms) {
      tuple.kind = Item::kTuple;
      tuple.items = std::move(items);
    }
    return Push(std::move(tuple));
  }
  // The items above the top mark, popped with it: how many, and the deepest.
  bool PopMark(size_t* count, int* deepest, std::vector<Item>* into = nullptr) {
    if (marks_.empty()) return false;
    *count = stack_.size() - marks_.back();
    *deepest = Pop(*count, into);
    marks_.pop_back();
    return true;
  }
  // The container on top takes items nested `deepest` deep.
  absl::Status Grow(int deepest) {
    const int depth = std::max(stack_.back().depth, deepest + 1);
    if (depth > max_depth_) {
      return Bad(absl::StrCat("values nest deeper than ", max_depth_, " levels"));
    }
    stack_.back().depth = depth;
    stack_.back().kind = Item::kOther;
    return absl::OkStatus();
  }

  absl::Status Step(bool* stop) {
    uint64_t n = 0;
    size_t count = 0;
    int deepest = 0;
    switch (op_) {
      case 0x80:  // PROTO
        if (!Little(1, &n)) return Bad("truncated");
        if (n > 2) {
          return Bad(absl::StrCat("pickle protocol ", n,
                                  "; torch.save's default (2) is the one read here"));
        }
        return absl::OkStatus();
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case '.':  // STOP
        if (!marks_.empty() || stack_.size() != 1) {
          return Bad(absl::StrCat("STOP with ", stack_.size(), " values and ", marks_.size(),
                                  " open marks; a pickle ends with one value"));
        }
        *stop = true;
        return absl::OkStatus();
      case 'N':   // NONE
      case 0x88:  // NEWTRUE
      case 0x89:  // NEWFALSE
      case ']':   // EMPTY_LIST
      case '}':   // EMPTY_DICT
      case ')':   // EMPTY_TUPLE
        return Push(op_ == ']' || op_ == '}' || op_ == ')' ? 1 : 0);
      case 'K':  // BININT1
        return Little(1, &n) ? PushAtom(Item::kInt, "", n) : Bad("truncated");
      case 'M':  // BININT2
        return Little(2, &n) ? PushAtom(Item::kInt, "", n) : Bad("truncated");
      case 'J':  // BININT
        if (!Little(4, &n)) return Bad("truncated");
        return n >> 31 ? Push(0) : PushAtom(Item::kInt, "", n);  // a negative one is no count
      case 'G':                                                  // BINFLOAT
        return Take(8) ? Push(0) : Bad("truncated");
      case 0x8a:  // LONG1
        if (!Little(1, &n)) return Bad("truncated");
        if (n > 8) return Bad(absl::StrCat("an integer of ", n, " bytes; at most 8 are read"));
        {
          uint64_t value = 0;
          if (!Little(static_cast<int>(n), &value)) return Bad("truncated");
          if (n > 0 && n < 8 && (value >> (8 * n - 1)) == 0) return PushAtom(Item::kInt, "", value);
          if (n == 8 && (value >> 63) == 0) return PushAtom(Item::kInt, "", value);
        }
        return Push(0);
      case 'X':  // BINUNICODE
      case 'T':  // BINSTRING
      {
        absl::string_view text;
        if (!Little(4, &n) || !Take(n, &text)) return Bad("truncated");
        if (n > 256) return Push(0);
        return PushAtom(Item::kString, std::string(text));
      }
      case 'U':  // SHORT_BINSTRING
        if (!Little(1, &n) || !Take(n)) return Bad("truncated");
        return Push(0);
      case 'c':  // GLOBAL
      {
        const size_t module = at_;
        if (!Line()) return Bad("a GLOBAL without its module and name lines");
        const size_t name = at_;
        if (!Line()) return Bad("a GLOBAL without its module and name lines");
        const absl::string_view module_name = p_.substr(module, name - 1 - module);
        const absl::string_view class_name = p_.substr(name, at_ - 1 - name);
        if (!IsConstructedGlobal(module_name, class_name)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "pickle at byte ", start_, " names ", module_name, ".", class_name,
              ", which dtrain never builds from a file: data and checkpoints hold tensors, "
              "numbers, strings, lists, tuples and dicts, and are never run as code"));
        }
        return PushAtom(Item::kGlobal, absl::StrCat(module_name, ".", class_name));
      }
      case 'q':  // BINPUT
      case 'r':  // LONG_BINPUT
        if (!Little(op_ == 'q' ? 1 : 4, &n)) return Bad("truncated");
        if (!Has(1)) return Bad("PUT with nothing to store");
        // Indices as Python's pickler numbers them, at most one past those defined, so that
        // libtorch's memo (a vector sized by the index) stays as small as the pickle.
        if (n > memo_.size()) {
          return Bad(
              absl::StrCat("memo index ", n, " skips past the ", memo_.size(), " defined so far"));
        }
        // An atom whole (Python's pickler memoizes the strings and GLOBALs of each persistent
        // id, and refers back to them), a container by its depth.
        {
          Item kept;
          kept.depth = stack_.back().depth;
          if (stack_.back().kind != Item::kOther && stack_.back().kind != Item::kTuple) {
            kept = stack_.back();
          }
          if (n == memo_.size()) {
            memo_.push_back(std::move(kept));
          } else {
            memo_[n] = std::move(kept);
          }
        }
        return absl::OkStatus();
      case 'h':  // BINGET
      case 'j':  // LONG_BINGET
        if (!Little(op_ == 'h' ? 1 : 4, &n)) return Bad("truncated");
        if (n >= memo_.size()) return Bad(absl::StrCat("memo index ", n, " was never stored"));
        return Push(memo_[n]);  // a copy
      case '0':                 // POP
        if (!Has(1)) return Bad("POP with nothing above the mark");
        Pop(1);
        return absl::OkStatus();
      case '2':  // DUP
        if (!Has(1)) return Bad("DUP with nothing above the mark");
        return Push(stack_.back().depth);
      case '1':  // POP_MARK
        if (!PopMark(&count, &deepest)) return Bad("no MARK to pop to");
        return absl::OkStatus();
      case 'a':  // APPEND
        if (!Has(2)) return Bad("APPEND needs a list and an item");
        deepest = Pop(1);
        return Grow(deepest);
      case 's':  // SETITEM
        if (!Has(3)) return Bad("SETITEM needs a dict, a key and a value");
        deepest = Pop(2);
        return Grow(deepest);
      case 'e':  // APPENDS
      case 'u':  // SETITEMS
        if (!PopMark(&count, &deepest)) return Bad("no MARK to pop to");
        if (op_ == 'u' && count % 2 != 0) return Bad("SETITEMS with an odd number of items");
        if (!Has(1)) return Bad("no list or dict below the MARK");
        return Grow(deepest);
      case 't':  // TUPLE
      {
        std::vector<Item> items;
        if (!PopMark(&count, &deepest, &items)) return Bad("no MARK to pop to");
        return PushTuple(std::move(items), deepest);
      }
      case 'l':  // LIST
      case 'd':  // DICT
        if (!PopMark(&count, &deepest)) return Bad("no MARK to pop to");
        if (op_ == 'd' && count % 2 != 0) return Bad("DICT with an odd number of items");
        return Push(deepest + 1);
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87:  // TUPLE3
      {
        count = op_ - 0x84;
        if (!Has(count)) return Bad(absl::StrCat("TUPLE", count, " needs ", count, " items"));
        std::vector<Item> items;
        deepest = Pop(count, &items);
        return PushTuple(std::move(items), deepest);
      }
      case 'R':   // REDUCE
      case 0x81:  // NEWOBJ
        if (!Has(2)) return Bad("needs a callable and its arguments");
        {
          // libtorch calls whatever its globals table holds at the index on the stack: only a
          // GLOBAL that builds something (not a storage type or a device name's index) may be
          // called, so a crafted int cannot pick another global.
          const Item& callable = stack_[stack_.size() - 2];
          if (callable.kind != Item::kGlobal || absl::EndsWith(callable.text, "Storage")) {
            return Bad("calls something other than a class or function the file names");
          }
          if (callable.text == kTypeTagGlobal && !stack_.back().value_and_short_string) {
            return Bad("restore_type_tag without a value and a type string of at most 256 bytes");
          }
        }
        return Push(Pop(2) + 1);
      case 'b':  // BUILD
        if (!Has(2)) return Bad("BUILD needs an object and its state");
        deepest = Pop(1);
        return Grow(deepest);
      case 'Q':  // BINPERSID
        if (!Has(1)) return Bad("BINPERSID needs an id");
        if (absl::Status s = NoteStorage(stack_.back()); !s.ok()) return s;
        return Push(Pop(1));
      default:
        return Bad("not an opcode of pickle protocol 2 as torch.save writes it");
    }
  }

  // torch.save's persistent id of a storage: ('storage', torch.<Type>Storage, key, location,
  // numel); anything else is refused, since libtorch reads each id as a storage.
  absl::Status NoteStorage(const Item& id) {
    const std::vector<Item>& f = id.items;
    if (id.kind != Item::kTuple || f.size() != 5 || f[0].kind != Item::kString ||
        f[0].text != "storage" || f[1].kind != Item::kGlobal || f[2].kind != Item::kString ||
        f[3].kind != Item::kString || f[4].kind != Item::kInt) {
      return Bad(
          "a persistent id other than torch.save's ('storage', type, key, location, "
          "numel)");
    }
    if (storages_ != nullptr) storages_->push_back({f[2].text, f[1].text, f[4].number});
    return absl::OkStatus();
  }

  absl::string_view p_;
  const int max_depth_;
  std::vector<PickledStorage>* storages_;
  size_t at_ = 0;
  size_t start_ = 0;
  unsigned op_ = 0;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::vector<Item> memo_;  // what each index holds: an atom whole, a container's depth
};

}  // namespace

bool IsConstructedGlobal(absl::string_view module, absl::string_view name) {
  if (module == "torch") {
    static constexpr absl::string_view kStorages[] = {
        "FloatStorage", "DoubleStorage", "HalfStorage",         "BFloat16Storage",
        "LongStorage",  "IntStorage",    "ShortStorage",        "CharStorage",
        "ByteStorage",  "BoolStorage",   "ComplexFloatStorage", "ComplexDoubleStorage"};
    return name == "device" ||
           std::find(std::begin(kStorages), std::end(kStorages), name) != std::end(kStorages);
  }
  if (module == "torch._utils") return name == "_rebuild_tensor_v2";
  if (module == "collections") return name == "OrderedDict";
  if (module == "torch.jit._pickle") {
    return name == "build_intlist" || name == "build_doublelist" || name == "build_boollist" ||
           name == "build_tensorlist" || name == "restore_type_tag";
  }
  return false;
}

absl::Status CheckPickle(absl::string_view pickle, int max_depth,
                         std::vector<PickledStorage>* storages) {
  return Walk(pickle, max_depth, storages).Run();
}

}  // namespace dtrain

#include "worker/model/pickle_check.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// What the walk keeps per stack item: how deeply it nests containers (an atom 0).
class Walk {
 public:
  Walk(absl::string_view p, int max_depth) : p_(p), max_depth_(max_depth) {}

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
  absl::Status Push(int depth) {
    if (depth > max_depth_) {
      return Bad(absl::StrCat("values nest deeper than ", max_depth_, " levels"));
    }
    stack_.push_back(depth);
    return absl::OkStatus();
  }
  // The deepest of the top `n` items, popped.
  int Pop(size_t n) {
    int deepest = 0;
    for (size_t i = 0; i < n; ++i) {
      deepest = std::max(deepest, stack_.back());
      stack_.pop_back();
    }
    return deepest;
  }
  // The items above the top mark, popped with it: how many, and the deepest.
  bool PopMark(size_t* count, int* deepest) {
    if (marks_.empty()) return false;
    *count = stack_.size() - marks_.back();
    *deepest = Pop(*count);
    marks_.pop_back();
    return true;
  }
  // The container on top takes items nested `deepest` deep.
  absl::Status Grow(int deepest) {
    const int depth = std::max(stack_.back(), deepest + 1);
    if (depth > max_depth_) {
      return Bad(absl::StrCat("values nest deeper than ", max_depth_, " levels"));
    }
    stack_.back() = depth;
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
        return Take(1) ? Push(0) : Bad("truncated");
      case 'M':  // BININT2
        return Take(2) ? Push(0) : Bad("truncated");
      case 'J':  // BININT
        return Take(4) ? Push(0) : Bad("truncated");
      case 'G':  // BINFLOAT
        return Take(8) ? Push(0) : Bad("truncated");
      case 0x8a:  // LONG1
        if (!Little(1, &n)) return Bad("truncated");
        if (n > 8) return Bad(absl::StrCat("an integer of ", n, " bytes; at most 8 are read"));
        return Take(n) ? Push(0) : Bad("truncated");
      case 'X':  // BINUNICODE
      case 'T':  // BINSTRING
        if (!Little(4, &n) || !Take(n)) return Bad("truncated");
        return Push(0);
      case 'U':  // SHORT_BINSTRING
        if (!Little(1, &n) || !Take(n)) return Bad("truncated");
        return Push(0);
      case 'c':  // GLOBAL
        if (!Line() || !Line()) return Bad("a GLOBAL without its module and name lines");
        return Push(0);
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
        if (n == memo_.size()) {
          memo_.push_back(stack_.back());
        } else {
          memo_[n] = stack_.back();
        }
        return absl::OkStatus();
      case 'h':  // BINGET
      case 'j':  // LONG_BINGET
        if (!Little(op_ == 'h' ? 1 : 4, &n)) return Bad("truncated");
        if (n >= memo_.size()) return Bad(absl::StrCat("memo index ", n, " was never stored"));
        return Push(memo_[n]);
      case '0':  // POP
        if (!Has(1)) return Bad("POP with nothing above the mark");
        Pop(1);
        return absl::OkStatus();
      case '2':  // DUP
        if (!Has(1)) return Bad("DUP with nothing above the mark");
        return Push(stack_.back());
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
      case 'l':  // LIST
      case 'd':  // DICT
        if (!PopMark(&count, &deepest)) return Bad("no MARK to pop to");
        if (op_ == 'd' && count % 2 != 0) return Bad("DICT with an odd number of items");
        return Push(deepest + 1);
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87:  // TUPLE3
        count = op_ - 0x84;
        if (!Has(count)) return Bad(absl::StrCat("TUPLE", count, " needs ", count, " items"));
        return Push(Pop(count) + 1);
      case 'R':   // REDUCE
      case 0x81:  // NEWOBJ
        if (!Has(2)) return Bad("needs a callable and its arguments");
        return Push(Pop(2) + 1);
      case 'b':  // BUILD
        if (!Has(2)) return Bad("BUILD needs an object and its state");
        deepest = Pop(1);
        return Grow(deepest);
      case 'Q':  // BINPERSID
        if (!Has(1)) return Bad("BINPERSID needs an id");
        return Push(Pop(1));
      default:
        return Bad("not an opcode of pickle protocol 2 as torch.save writes it");
    }
  }

  absl::string_view p_;
  const int max_depth_;
  size_t at_ = 0;
  size_t start_ = 0;
  unsigned op_ = 0;
  std::vector<int> stack_;
  std::vector<size_t> marks_;
  std::vector<int> memo_;  // the depth of what each index holds
};

}  // namespace

absl::Status CheckPickle(absl::string_view pickle, int max_depth) {
  return Walk(pickle, max_depth).Run();
}

}  // namespace dtrain

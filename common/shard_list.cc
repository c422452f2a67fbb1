#include "common/shard_list.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dtrain {
namespace {

// One brace group, kept unexpanded until the total count is known to be within bounds: a range
// `{0..999999}` is two numbers, not a million strings.
struct Group {
  std::string prefix;                  // the literal text before the group
  std::vector<std::string> choices;    // {x,y,...}
  uint64_t lo = 0, hi = 0, width = 0;  // {lo..hi}, when choices is empty
  uint64_t count() const { return choices.empty() ? hi - lo + 1 : choices.size(); }
  size_t longest() const {
    if (choices.empty()) return std::max<size_t>(width, absl::StrCat(hi).size());
    size_t n = 0;
    for (const std::string& c : choices) n = std::max(n, c.size());
    return n;
  }
  // The bytes of all its values together, exactly: a range's values by their number of digits,
  // each at least the padded width.
  uint64_t bytes() const {
    uint64_t n = 0;
    if (!choices.empty()) {
      for (const std::string& c : choices) n += c.size();
      return n;
    }
    uint64_t from = 0, to = 9;  // the values of `digits` digits
    for (uint64_t digits = 1; from <= hi; ++digits) {
      const uint64_t first = std::max(from, lo), last = std::min(to, hi);
      if (first <= last) n += (last - first + 1) * std::max<uint64_t>(digits, width);
      if (digits == 19) break;  // AllDigits keeps bounds to 18 digits
      from = to + 1;
      to = to * 10 + 9;
    }
    return n;
  }
  std::string At(uint64_t i) const {
    if (!choices.empty()) return choices[i];
    std::string digits = absl::StrCat(lo + i);
    if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
    return digits;
  }
};

// What to do about too many bytes of names, the same words wherever they are refused.
constexpr absl::string_view kShardBytesAdvice =
    " (name fewer or shorter shards, or split the data into several datasets)";

absl::Status BadPattern(absl::string_view pattern, size_t at, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("shard pattern '", pattern, "': ", why, " at character ", at + 1));
}

bool AllDigits(absl::string_view s) {
  if (s.empty() || s.size() > 18) return false;  // 18 digits fit in uint64_t
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::Status ParseGroup(absl::string_view pattern, size_t open, absl::string_view body,
                        Group* group) {
  if (body.empty()) return BadPattern(pattern, open, "empty braces");
  const size_t dots = body.find("..");
  if (dots != absl::string_view::npos && body.find(',') == absl::string_view::npos) {
    const absl::string_view lo = body.substr(0, dots), hi = body.substr(dots + 2);
    if (!AllDigits(lo) || !AllDigits(hi)) {
      return BadPattern(pattern, open, "a range's bounds must be decimal numbers ({0..99})");
    }
    (void)absl::SimpleAtoi(lo, &group->lo);
    (void)absl::SimpleAtoi(hi, &group->hi);
    if (group->lo > group->hi) {
      return BadPattern(pattern, open, "a range must go up ({lo..hi} with lo <= hi)");
    }
    const bool padded = (lo.size() > 1 && lo[0] == '0') || (hi.size() > 1 && hi[0] == '0');
    group->width = padded ? std::max(lo.size(), hi.size()) : 0;
    return absl::OkStatus();
  }
  group->choices = absl::StrSplit(body, ',');
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandShardPattern(absl::string_view pattern,
                                                            size_t max_names, size_t max_bytes) {
  std::vector<Group> groups;
  std::string literal;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '}') return BadPattern(pattern, i, "'}' without '{'");
    if (c != '{') {
      literal.push_back(c);
      continue;
    }
    const size_t close = pattern.find('}', i + 1);
    if (close == absl::string_view::npos) return BadPattern(pattern, i, "'{' without '}'");
    const absl::string_view body = pattern.substr(i + 1, close - i - 1);
    if (body.find('{') != absl::string_view::npos) {
      return BadPattern(pattern, i, "braces do not nest");
    }
    Group group;
    group.prefix = std::move(literal);
    literal.clear();
    if (absl::Status s = ParseGroup(pattern, i, body, &group); !s.ok()) return s;
    groups.push_back(std::move(group));
    i = close;
  }
  // Bounds first: how many names, and how long the longest, before one is made.
  uint64_t total = 1;
  size_t longest = literal.size();
  for (const Group& g : groups) {
    if (g.count() > max_names || total > max_names / g.count()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pattern '", pattern, "' names more than ", max_names, " shards"));
    }
    total *= g.count();
    longest += g.prefix.size() + g.longest();
  }
  if (total > max_names) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard pattern '", pattern, "' names more than ", max_names, " shards"));
  }
  if (longest > kMaxShardNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shard pattern '", pattern, "' makes names of ",
                                                   longest, " bytes; at most ",
                                                   kMaxShardNameBytes));
  }
  // Each group's values appear total / count times each, the literals in every name. A caller
  // may pass any max_names, so the sum is checked for overflow.
  uint64_t bytes = 0;
  bool over = false;
  const auto add = [&](uint64_t times, uint64_t each) {
    uint64_t product = 0;
    over = over || __builtin_mul_overflow(times, each, &product) ||
           __builtin_add_overflow(bytes, product, &bytes);
  };
  add(total, literal.size());
  for (const Group& g : groups) {
    add(total, g.prefix.size());
    add(total / g.count(), g.bytes());
  }
  if (over || bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard pattern '", pattern, "' makes ", over ? "more than 2^64" : absl::StrCat(bytes),
        " bytes of names, over the ", max_bytes, " allowed here", kShardBytesAdvice));
  }
  std::vector<std::string> names;
  names.reserve(total);
  std::vector<uint64_t> at(groups.size(), 0);  // an odometer, the rightmost group fastest
  for (uint64_t n = 0; n < total; ++n) {
    std::string name;
    for (size_t g = 0; g < groups.size(); ++g) {
      absl::StrAppend(&name, groups[g].prefix, groups[g].At(at[g]));
    }
    absl::StrAppend(&name, literal);
    names.push_back(std::move(name));
    for (size_t g = groups.size(); g-- > 0;) {
      if (++at[g] < groups[g].count()) break;
      at[g] = 0;
    }
  }
  return names;
}

bool NamesTarShards(absl::string_view name) {
  return absl::EndsWith(name, ".tar") || absl::EndsWith(name, ".tar.gz") ||
         absl::EndsWith(name, ".tgz");
}

absl::StatusOr<std::vector<ShardEntry>> ParseShardList(absl::string_view text, size_t max_shards,
                                                       size_t max_bytes) {
  std::vector<ShardEntry> shards;
  size_t bytes = 0;  // of the locations so far
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("shard list, line ", number, ": ", why));
    };
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() > 3) return bad("expected '<shard> [sha256:<hex>] [samples:<n>]'");
    ShardEntry entry;
    for (size_t f = 1; f < fields.size(); ++f) {
      absl::string_view token = fields[f];
      if (absl::ConsumePrefix(&token, "sha256:")) {
        if (!entry.digest.empty()) return bad("two digests");
        if (token.size() != 64 || token.find_first_not_of("0123456789abcdef") != token.npos) {
          return bad("a digest is sha256: and 64 lowercase hex digits");
        }
        entry.digest = std::string(fields[f]);
      } else if (absl::ConsumePrefix(&token, "samples:")) {
        int64_t n = 0;
        if (entry.samples >= 0) return bad("two sample counts");
        if (token.empty() || token.size() > 12 || !absl::SimpleAtoi(token, &n) || n < 0 ||
            token.find_first_not_of("0123456789") != token.npos) {
          return bad("a sample count is samples: and a whole number below 10^12");
        }
        entry.samples = n;
      } else {
        return bad(absl::StrCat("'", fields[f],
                                "' is neither sha256:<hex> nor samples:<n>; expected "
                                "'<shard> [sha256:<hex>] [samples:<n>]'"));
      }
    }
    if (fields.size() > 1) {
      if (fields[0].find_first_of("{}") != absl::string_view::npos) {
        return bad("a shard with a digest or a count names one file; braces would name several");
      }
      if (fields[0].size() > kMaxShardNameBytes) return bad("the shard's name is too long");
      if (shards.size() >= max_shards)
        return bad(absl::StrCat("more than ", max_shards, " shards"));
      if (fields[0].size() > max_bytes - bytes) {
        return bad(
            absl::StrCat("the list's names pass ", max_bytes, " bytes in all", kShardBytesAdvice));
      }
      bytes += fields[0].size();
      entry.location = std::string(fields[0]);
      shards.push_back(std::move(entry));
      continue;
    }
    absl::StatusOr<std::vector<std::string>> names =
        ExpandShardPattern(fields[0], max_shards - shards.size(), max_bytes - bytes);
    if (!names.ok()) return bad(names.status().message());
    for (std::string& name : *names) {
      bytes += name.size();
      shards.push_back({std::move(name), "", -1});
    }
  }
  if (shards.empty()) {
    return absl::InvalidArgumentError("shard list names no shard (only blank lines or comments)");
  }
  return shards;
}

}  // namespace dtrain

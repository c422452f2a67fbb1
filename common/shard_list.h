// Shard lists as WebDataset users write them: brace notation (`train-{000000..001023}.tar`,
// `{a,b}`), or a list file with one shard per line and an optional digest to check it against.
// Plain C++ and shared: the CLI expands a list to upload the client's own shards, a worker to
// read its share. Every input is hostile: counts are bounded before anything is allocated.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The most shards one list may name: ImageNet in WebDataset's 1 GB shards is ~150; a million
// leaves room for tiny shards and still bounds what a list can make a process allocate.
inline constexpr size_t kMaxShards = size_t{1} << 20;
// A shard's name or URL, after expansion.
inline constexpr size_t kMaxShardNameBytes = 4096;
// A list file, and the names one list or pattern makes in all: the two bounds above alone would
// let a 4 KB line make 4 GiB of names; with this one a pattern makes no more than a list file
// that writes its names out may hold.
inline constexpr size_t kMaxShardListBytes = size_t{256} << 20;

// Expands every `{lo..hi}` (decimal, lo <= hi; zero-padded to the wider bound when either bound
// has a leading zero, as WebDataset's braceexpand does) and `{x,y,...}` in `pattern`, leftmost
// varying slowest. Braces do not nest. A pattern without braces is itself. INVALID_ARGUMENT,
// naming the pattern and the position, for an unbalanced or empty brace, a reversed range, a
// bound that is not a number, more than `max_names` names or more than `max_bytes` bytes of
// them in all (both counted before any is made).
absl::StatusOr<std::vector<std::string>> ExpandShardPattern(absl::string_view pattern,
                                                            size_t max_names = kMaxShards,
                                                            size_t max_bytes = kMaxShardListBytes);

// A name of tar shards, or a pattern of them: it ends in .tar, .tar.gz or .tgz (a list file or a
// directory does not).
bool NamesTarShards(absl::string_view name);

struct ShardEntry {
  std::string location;  // a path or URL
  std::string digest;    // "sha256:<64 lowercase hex>", or empty when the list gives none
  int64_t samples = -1;  // the samples it holds, or -1 when the list does not say
};

// A list file's text: one shard per line, `<location> [sha256:<hex>] [samples:<n>]` (the tokens
// in any order; dtrain.data.write_shards writes both); blank lines and lines starting with '#'
// are skipped; a location with neither token may use brace notation. At most
// `max_shards` in all, their locations at most `max_bytes` together. INVALID_ARGUMENT naming the
// line (1-based) otherwise, and when the list names no shard.
absl::StatusOr<std::vector<ShardEntry>> ParseShardList(absl::string_view text,
                                                       size_t max_shards = kMaxShards,
                                                       size_t max_bytes = kMaxShardListBytes);

}  // namespace dtrain

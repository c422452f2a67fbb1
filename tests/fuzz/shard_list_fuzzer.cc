// libFuzzer target: shard lists (common/shard_list.h), the text a job spec or a list file
// gives for a dataset's shards. Both the whole input as a list file and its first line as a
// pattern. A crash, a sanitizer report, more names than the bound, a name above its length
// bound, names past the bound on their bytes in all, or a count of those bytes that is not exact
// is a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/shard_list.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // A small bound, so that the fuzzer explores the checks rather than allocating millions.
  constexpr size_t kBound = 4096;
  constexpr size_t kBytes = 1 << 20;
  const std::string first = text.substr(0, text.find('\n'));
  absl::StatusOr<std::vector<std::string>> names =
      dtrain::ExpandShardPattern(first, kBound, kBytes);
  if (names.ok()) {
    if (names->empty() || names->size() > kBound) std::abort();
    size_t bytes = 0;
    for (const std::string& n : *names) {
      if (n.size() > dtrain::kMaxShardNameBytes) std::abort();
      bytes += n.size();
    }
    if (bytes > kBytes) std::abort();
    // The count before expanding is exact: a byte less must be refused.
    if (bytes > 0 && dtrain::ExpandShardPattern(first, kBound, bytes - 1).ok()) std::abort();
  }
  absl::StatusOr<std::vector<dtrain::ShardEntry>> list =
      dtrain::ParseShardList(text, kBound, kBytes);
  if (list.ok()) {
    if (list->empty() || list->size() > kBound) std::abort();
    size_t bytes = 0;
    for (const dtrain::ShardEntry& e : *list) bytes += e.location.size();
    if (bytes > kBytes) std::abort();
  }
  return 0;
}

// libFuzzer target: a WebDataset shard (worker/data/tar_shard_reader.h) as a worker reads one,
// from a file holding the input, with small limits so that the fuzzer explores the checks. A
// crash, a sanitizer report, a member or sample above its limit, a sample with no field, or a
// shard read to its end whose samples differ in number from CountTarSamples' count of its
// headers (common/tar_sample_count.h) is a finding. Built and run by tests/fuzz/run.sh (needs
// libarchive-dev).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/tar_sample_count.h"
#include "worker/data/tar_shard_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tar_shard_fuzzer-" + std::to_string(getpid()) + ".tar";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  dtrain::TarShardLimits limits;
  limits.max_member_bytes = 1 << 16;
  limits.max_sample_bytes = 1 << 18;
  limits.max_fields = 8;
  absl::StatusOr<std::unique_ptr<dtrain::TarShardReader>> reader =
      dtrain::TarShardReader::Open(path, limits);
  // The count the client uploads with a shard, from its headers alone: every rank plans its
  // part of an epoch from it, so a shard read to its end must yield exactly that many samples.
  const absl::StatusOr<int64_t> counted = dtrain::CountTarSamples(path);
  if (counted.ok() && *counted < 0) std::abort();
  if (!reader.ok()) return 0;
  int64_t read = 0;
  for (int i = 0; i < 10000; ++i) {
    absl::StatusOr<std::optional<dtrain::ShardSample>> next = (*reader)->Next();
    if (!next.ok()) return 0;
    if (!next->has_value()) {
      if (counted.ok() && *counted != read) std::abort();
      return 0;
    }
    ++read;
    const dtrain::ShardSample& s = **next;
    if (s.fields.empty() || static_cast<int>(s.fields.size()) > limits.max_fields) std::abort();
    int64_t bytes = 0;
    for (const auto& [field, value] : s.fields) {
      if (static_cast<int64_t>(value.size()) > limits.max_member_bytes) std::abort();
      bytes += static_cast<int64_t>(value.size());
    }
    if (bytes > limits.max_sample_bytes) std::abort();
  }
  return 0;
}

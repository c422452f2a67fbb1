// TarShardReader: the samples of one WebDataset shard, a POSIX tar file in which a sample is the
// consecutive files that share a key (the path up to the first '.' of the file's name) and each
// file's extension names a field ("cls", "jpg", "seg.png"). Read with libarchive as a stream, one
// sample at a time, so memory is bounded by the largest sample, not the shard. Plain C++ (no
// libtorch): decoding the fields into tensors is the dataset's job.
//
// Thread-safety: one thread per reader.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/tar_sample_count.h"

struct archive;

namespace dtrain {

struct ShardSample {
  std::string key;                            // "n01440764/img_0001", from the member's path
  std::map<std::string, std::string> fields;  // extension (lowercased) -> the member's bytes
};

struct TarShardLimits {
  // A member larger than this is refused before it is read (a tar header may claim any size).
  int64_t max_member_bytes = int64_t{64} << 20;
  // All of one sample's members together.
  int64_t max_sample_bytes = int64_t{256} << 20;
  // Members of one sample.
  int max_fields = 64;
};

class TarShardReader {
 public:
  // Opens `path` (a tar file, uncompressed or gzip). NOT_FOUND / PERMISSION_DENIED naming it.
  static absl::StatusOr<std::unique_ptr<TarShardReader>> Open(const std::string& path,
                                                              TarShardLimits limits = {});
  ~TarShardReader();
  TarShardReader(const TarShardReader&) = delete;
  TarShardReader& operator=(const TarShardReader&) = delete;

  // The next sample, or nullopt at the end of the shard. DATA_LOSS naming the shard and the
  // member for a damaged or truncated archive; INVALID_ARGUMENT for a member over a limit, a
  // field twice in one sample, or a member name without an extension. Directories are skipped;
  // links, devices and other non-regular members are refused (a shard holds data only).
  absl::StatusOr<std::optional<ShardSample>> Next();

  int64_t samples_read() const { return samples_read_; }

 private:
  TarShardReader(std::string path, TarShardLimits limits, struct archive* archive);
  // Reads the next regular member into pending_; false at the end.
  absl::StatusOr<bool> ReadMember();

  const std::string path_;
  const TarShardLimits limits_;
  struct archive* archive_;
  // The member read ahead: the first of the next sample.
  std::optional<std::pair<std::string, std::string>> pending_key_field_;
  std::string pending_bytes_;
  bool at_end_ = false;
  int64_t samples_read_ = 0;
};

}  // namespace dtrain

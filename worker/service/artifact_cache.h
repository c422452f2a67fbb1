// ArtifactCache: the worker's local copies of files its jobs name by content
// ("artifact:sha256:<hex>" in a spec), fetched from the coordinator's Artifacts service once,
// verified by digest, and kept under a size bound with the least recently used evicted. A
// copy changed on disk since it was verified (by a job's code running as the worker's user)
// is verified again before a job uses it, and fetched anew when it no longer matches. A
// second job with the same model or data starts without a transfer; ddp_spawn children use
// their daemon's copy. Plain C++ (no libtorch).
// How a spec names such a file is common/file_reference.h.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

class ArtifactCache {
 public:
  // Fetches `digest` into `path` (verified, atomic); ArtifactsClient::Fetch in production.
  using Fetcher = std::function<absl::Status(const std::string& digest, const std::string& path)>;

  ArtifactCache(std::string dir, int64_t max_bytes, Fetcher fetch);

  // The local copy of `digest` ("sha256:<hex>"). Fetches a missing one; evicts the least
  // recently used others to stay within max_bytes (a file larger than the bound is still
  // fetched and kept until the next one needs the room). INVALID_ARGUMENT for a malformed
  // digest; the fetch's error, naming the digest, otherwise.
  // A corrupted or interrupted transfer (DATA_LOSS, UNAVAILABLE) is tried again, up to
  // kFetchAttempts in all; a copy that does not hash to `digest` is never kept.
  absl::StatusOr<std::string> Get(const std::string& digest);
  static constexpr int kFetchAttempts = 3;

  // Takes `path`, a file this worker wrote whose content is `digest` (a checkpoint it sent to
  // the coordinator), into the cache by renaming it, so a resume here needs no transfer. On
  // failure (another filesystem) the file is left where it is.
  absl::Status Adopt(const std::string& path, const std::string& digest);

  int64_t hits() const;
  int64_t misses() const;
  int64_t bytes() const;
  // Cached copies found changed since they were checked and dropped (then fetched again).
  int64_t tampered() const;

 private:
  void EvictLocked(int64_t keep_free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const int64_t max_bytes_;
  const Fetcher fetch_;
  // One fetch at a time: two jobs asking for the same file fetch it once.
  absl::Mutex fetch_mu_;
  mutable absl::Mutex mu_;
  // What the file looked like when its content was last checked against its digest. Anything
  // that writes it, renames over it or changes its mode changes its ctime, which no
  // unprivileged process can set back: a file whose seal differs is hashed again before use.
  struct Seal {
    uint64_t device = 0, inode = 0;
    int64_t size = -1, ctime_ns = -1;  // size -1: not checked
    // Taken long enough after the file's last change that a later write shows in its ctime.
    bool firm = false;
    bool operator==(const Seal& o) const {
      return device == o.device && inode == o.inode && size == o.size && ctime_ns == o.ctime_ns;
    }
  };
  struct Entry {
    int64_t size = 0;
    int64_t last_use = 0;
    Seal seal;
  };
  static Seal SealOf(const struct stat& st);
  // Opens `path` (never through a link), makes it read-only and, unless `digest` is empty,
  // hashes it: its seal, or an unchecked one (size -1) when it is not a regular file, its bytes
  // are not `digest`'s, or it changed while being read.
  static Seal Verify(const std::string& path, const std::string& digest);

  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by digest
  int64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tampered_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dtrain

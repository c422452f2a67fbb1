// A sharded split's shards with their sample counts, resolved from what the spec names, and
// the way a worker gets one shard as a local file. The spec's value for a split is one of:
//   a pattern of tar shards   "worker:/data/train-{000000..000099}.tar", "https://h/t-{0..9}.tar"
//   a directory               "worker:/data/train" (its *.tar, *.tar.gz and *.tgz, sorted)
//   a list file               anything else ("worker:/data/train.txt", "https://h/train.txt", an
//                             uploaded "artifact:sha256:..."): common/shard_list.h's format;
//                             a relative location in it is relative to the list's own place.
// Streaming needs each shard's sample count before the first step (every rank plans its chunk
// from them): a list file gives them (`samples:<n>`, as dtrain.data.write_shards writes); shards
// on the worker's own disk without one are counted here by walking their tar headers. A remote
// shard without a count is refused, saying how to give it.
//
// Plain C++ (no libtorch). Thread-safety: ResolveShards is reentrant; a ShardFetcher's
// functions must be safe to call from several threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {

struct CatalogShard {
  std::string location;  // "worker:/...", "https://...", "artifact:sha256:..."
  std::string digest;    // "sha256:<hex>" or empty
  int64_t samples = 0;
};

struct ShardCatalog {
  std::vector<CatalogShard> shards;
  int64_t samples = 0;
};

// A shard (or list file) as a local file. `temporary`: a download of this worker's own, removed
// once read; otherwise a file that stays (the worker's data, or the artifact cache's copy).
struct LocalShard {
  std::string path;
  bool temporary = false;
};

// How a worker reaches what a location names. Each returns NOT_FOUND, UNAVAILABLE,
// DEADLINE_EXCEEDED, DATA_LOSS (digest), CANCELLED... naming the location.
struct ShardFetcher {
  // An uploaded file by digest ("sha256:<hex>"), as a path in the worker's artifact cache. Unset:
  // artifact locations are refused (FAILED_PRECONDITION).
  std::function<absl::StatusOr<std::string>(const std::string& digest)> artifact;
  // An http(s) URL into `dest`, checked against `digest` when given; a try lasts at most
  // `attempt_timeout` (zero: no bound beyond the fetcher's own). The body's bytes are added to
  // `received` (when not null) as they arrive. Unset: URLs are refused.
  std::function<absl::Status(const std::string& url, const std::string& dest,
                             const std::string& digest, const std::atomic<bool>* cancelled,
                             absl::Duration attempt_timeout, std::atomic<int64_t>* received)>
      url;
  // A try at a shard list: a list is small, so a server that trickles it (a byte within each
  // stall timeout) must not hold a job's Setup for longer. Shards have no such bound: a 64 GiB
  // shard may take long legitimately.
  absl::Duration list_attempt_timeout = absl::Minutes(2);
  // Where downloads are spooled ("" : the system's temporary directory).
  std::string spool_dir;
};

// The shards `spec_value` names (see above). INVALID_ARGUMENT for a malformed pattern or list
// (naming the line), NOT_FOUND for a missing directory, list or local shard, FAILED_PRECONDITION
// for a remote shard without a count; `field` starts every message ("spec.data.shards.train").
// `cancelled` (may be null) ends a list's download (CANCELLED).
absl::StatusOr<ShardCatalog> ResolveShards(const std::string& spec_value, const std::string& field,
                                           const ShardFetcher& fetcher,
                                           const std::atomic<bool>* cancelled = nullptr);

// `shard` as a local file: a worker path as it is (its digest checked when the list gives one),
// an artifact through the cache, a URL downloaded into the spool directory (temporary).
// `received` (may be null) counts a download's bytes as they arrive.
absl::StatusOr<LocalShard> FetchShard(const CatalogShard& shard, const ShardFetcher& fetcher,
                                      const std::atomic<bool>* cancelled,
                                      std::atomic<int64_t>* received = nullptr);

}  // namespace dtrain

// One rank's raw samples of one epoch of a sharded split, in the order the step sees them: the
// rank's segments (epoch_plan.h) read shard by shard, through the shuffle buffer when training,
// numbered by position. Starting at a position > 0 (a resumed job, a re-sent step) replays the
// epoch from its start without handing out what comes before, so the order is the same as an
// uninterrupted run's; what it costs is reading, not decoding, the skipped samples.
//
// The next shard is fetched in the background while the current one is read, so a download
// overlaps the reading. With on_error skip, a shard that cannot be fetched or read yields one
// failed item per sample it still owed (the positions stay those of a clean run).
//
// Plain C++ (no libtorch). Thread-safety: one thread calls Next; Cancel from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/epoch_plan.h"
#include "worker/data/shard_catalog.h"
#include "worker/data/tar_shard_reader.h"

namespace dtrain {

struct StreamItem {
  int64_t position = 0;
  std::string shard;   // its location
  ShardSample sample;  // key and fields
  absl::Status error;  // on_error skip: why this sample is missing (sample.key may be "")
};

struct SampleStreamOptions {
  const ShardCatalog* catalog = nullptr;  // outlives the stream
  ShardFetcher fetcher;
  EpochPlanInput plan;  // world, rank, training, shuffle, seed, epoch
  size_t shuffle_buffer = 0;
  bool skip_errors = false;
  int64_t start = 0;  // the first position handed out
  TarShardLimits limits;
  // The fields a batch uses (extensions); the others are dropped as each sample is read, before
  // the shuffle buffer holds it. Empty: keep all.
  std::set<std::string> keep_fields;
};

class SampleStream {
 public:
  explicit SampleStream(SampleStreamOptions options);
  ~SampleStream();
  SampleStream(const SampleStream&) = delete;
  SampleStream& operator=(const SampleStream&) = delete;

  // The next item, or nullopt after the rank's last sample of the epoch. An error (on_error
  // fail) names the shard, the sample key when there is one, and the rank; the stream is
  // spent afterwards.
  absl::StatusOr<std::optional<StreamItem>> Next();
  void Cancel() { cancelled_.store(true); }

  int64_t epoch_samples() const { return epoch_samples_; }
  // Raw samples read so far, those a resumed stream replays without handing out included, and
  // bytes of shards downloaded so far over http(s) (the next shard's too, fetched while this
  // one is read); and whether the stream waits for a shard's download. From any thread, so that
  // a long replay or a long download counts as progress, not as a stuck stream.
  int64_t raw_read() const { return raw_read_.load(std::memory_order_relaxed); }
  int64_t downloaded() const { return downloaded_.load(std::memory_order_relaxed); }
  bool awaiting_shard() const { return awaiting_shard_.load(std::memory_order_relaxed); }

 private:
  // The next item of the rank's chunk before the shuffle buffer; nullopt at its end.
  absl::StatusOr<std::optional<StreamItem>> NextRaw();
  void StartFetch(size_t segment);
  absl::Status Named(const absl::Status& s, const std::string& shard, const std::string& key) const;

  SampleStreamOptions options_;
  std::vector<ShardSegment> segments_;
  int64_t epoch_samples_ = 0;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> raw_read_{0};
  std::atomic<int64_t> downloaded_{0};       // bytes, by the fetches below (which it outlives)
  std::atomic<bool> awaiting_shard_{false};  // NextRaw waits for a fetch
  // Reading segment `segment_`: its reader, the samples left to skip and to take.
  size_t segment_ = 0;
  std::unique_ptr<TarShardReader> reader_;
  std::optional<LocalShard> open_;
  int64_t to_skip_ = 0;
  int64_t to_take_ = 0;
  bool segment_open_ = false;
  absl::Status segment_error_;  // why the segment's remaining samples are missing
  // The next segment's fetch, under way.
  std::optional<std::future<absl::StatusOr<LocalShard>>> prefetch_;
  size_t prefetch_segment_ = 0;
  ShuffleBuffer<StreamItem> shuffle_;
  bool raw_done_ = false;
  int64_t next_position_ = 0;
  bool failed_ = false;
};

}  // namespace dtrain

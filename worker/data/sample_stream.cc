#include "worker/data/sample_stream.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

void RemoveIfTemporary(const std::optional<LocalShard>& shard) {
  if (shard.has_value() && shard->temporary) {
    std::error_code ec;
    std::filesystem::remove(shard->path, ec);
  }
}

}  // namespace

SampleStream::SampleStream(SampleStreamOptions options)
    : options_(std::move(options)),
      shuffle_(options_.plan.training ? options_.shuffle_buffer : 0,
               MixSeed({options_.plan.seed, static_cast<uint64_t>(options_.plan.epoch),
                        static_cast<uint64_t>(options_.plan.rank), 0x53485546ULL})) {
  for (const CatalogShard& s : options_.catalog->shards) {
    options_.plan.shard_samples.push_back(s.samples);
  }
  segments_ = PlanRankEpoch(options_.plan);
  for (const ShardSegment& s : segments_) epoch_samples_ += s.take;
}

SampleStream::~SampleStream() {
  cancelled_.store(true);
  reader_.reset();
  RemoveIfTemporary(open_);
  if (prefetch_.has_value() && prefetch_->valid()) {
    try {
      absl::StatusOr<LocalShard> pending = prefetch_->get();
      if (pending.ok()) RemoveIfTemporary(*pending);
    } catch (const std::exception&) {
      // Nothing to remove: the fetch failed before it made a file.
    }
  }
}

absl::Status SampleStream::Named(const absl::Status& s, const std::string& shard,
                                 const std::string& key) const {
  return absl::Status(
      s.code(),
      absl::StrCat("rank ", options_.plan.rank, ", shard '", shard, "'",
                   key.empty() ? "" : absl::StrCat(", sample '", key, "'"), ": ", s.message()));
}

void SampleStream::StartFetch(size_t segment) {
  if (segment >= segments_.size()) return;
  const CatalogShard* shard = &options_.catalog->shards[segments_[segment].shard];
  const ShardFetcher* fetcher = &options_.fetcher;
  const std::atomic<bool>* cancelled = &cancelled_;
  std::atomic<int64_t>* downloaded = &downloaded_;
  prefetch_segment_ = segment;
  prefetch_ = std::async(
      std::launch::async, [shard, fetcher, cancelled, downloaded]() -> absl::StatusOr<LocalShard> {
        try {
          return FetchShard(*shard, *fetcher, cancelled, downloaded);
        } catch (const std::exception& e) {
          return absl::InternalError(absl::StrCat("fetching failed: ", e.what()));
        }
      });
}

absl::StatusOr<std::optional<StreamItem>> SampleStream::NextRaw() {
  while (true) {
    if (cancelled_.load()) return absl::CancelledError("the data stream was stopped");
    if (segment_ >= segments_.size()) return std::optional<StreamItem>();
    const ShardSegment& seg = segments_[segment_];
    const std::string& location = options_.catalog->shards[seg.shard].location;
    auto owed = [&](const absl::Status& why,
                    const std::string& key) -> absl::StatusOr<std::optional<StreamItem>> {
      if (!options_.skip_errors) return Named(why, location, key);
      // One failed item per sample still owed, so the positions stay those of a clean run.
      StreamItem item;
      item.shard = location;
      item.sample.key = key;
      item.error = Named(why, location, key);
      --to_take_;
      if (to_take_ == 0) {
        reader_.reset();
        RemoveIfTemporary(open_);
        open_.reset();
        segment_open_ = false;
        ++segment_;
      }
      return std::optional<StreamItem>(std::move(item));
    };
    if (!segment_open_) {
      segment_open_ = true;
      to_skip_ = seg.skip;
      to_take_ = seg.take;
      if (!prefetch_.has_value() || prefetch_segment_ != segment_) StartFetch(segment_);
      awaiting_shard_.store(true, std::memory_order_relaxed);
      absl::StatusOr<LocalShard> local = prefetch_->get();
      awaiting_shard_.store(false, std::memory_order_relaxed);
      prefetch_.reset();
      if (!local.ok()) {
        StartFetch(segment_ + 1);
        reader_.reset();
        segment_error_ = local.status();
        return owed(segment_error_, "");
      }
      open_ = std::move(*local);
      absl::StatusOr<std::unique_ptr<TarShardReader>> reader =
          TarShardReader::Open(open_->path, options_.limits);
      // The next shard is fetched once this one is open: a cache that evicts it to make room
      // then takes only its name, not the bytes being read.
      StartFetch(segment_ + 1);
      // A download of our own is unlinked once open (the descriptor keeps it readable), so a
      // worker killed while reading leaves no spool file behind.
      if (reader.ok() && open_->temporary) {
        RemoveIfTemporary(open_);
        open_->temporary = false;
      }
      if (!reader.ok()) {
        segment_error_ = reader.status();
        return owed(segment_error_, "");
      }
      reader_ = std::move(*reader);
    }
    if (reader_ == nullptr) return owed(segment_error_, "");
    absl::StatusOr<std::optional<ShardSample>> sample = reader_->Next();
    if (!sample.ok()) {
      reader_.reset();
      segment_error_ = sample.status();
      return owed(segment_error_, "");
    }
    if (!sample->has_value()) {
      const int64_t read = reader_->samples_read();
      reader_.reset();
      segment_error_ = absl::DataLossError(
          absl::StrCat("the shard ended after ", read, " samples; its list says ",
                       options_.catalog->shards[seg.shard].samples));
      return owed(segment_error_, "");
    }
    if (to_skip_ > 0) {
      --to_skip_;
      continue;
    }
    StreamItem item;
    item.shard = location;
    item.sample = std::move(**sample);
    if (!options_.keep_fields.empty()) {
      for (auto it = item.sample.fields.begin(); it != item.sample.fields.end();) {
        it = options_.keep_fields.count(it->first) > 0 ? std::next(it)
                                                       : item.sample.fields.erase(it);
      }
    }
    if (--to_take_ == 0) {
      reader_.reset();
      RemoveIfTemporary(open_);
      open_.reset();
      segment_open_ = false;
      ++segment_;
    }
    return std::optional<StreamItem>(std::move(item));
  }
}

absl::StatusOr<std::optional<StreamItem>> SampleStream::Next() {
  if (failed_) return absl::FailedPreconditionError("the data stream failed before");
  while (true) {
    std::optional<StreamItem> out;
    if (!raw_done_) {
      absl::StatusOr<std::optional<StreamItem>> raw = NextRaw();
      if (!raw.ok()) {
        failed_ = true;
        return raw.status();
      }
      if (raw->has_value()) {
        raw_read_.fetch_add(1, std::memory_order_relaxed);
        out = shuffle_.Push(std::move(**raw));
        if (!out.has_value()) continue;
      } else {
        raw_done_ = true;
      }
    }
    if (!out.has_value()) out = shuffle_.Drain();
    if (!out.has_value()) return std::optional<StreamItem>();
    out->position = next_position_++;
    if (out->position < options_.start) continue;
    return out;
  }
}

}  // namespace dtrain

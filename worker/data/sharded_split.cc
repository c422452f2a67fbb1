#include "worker/data/sharded_split.h"

#include <pthread.h>
#include <sched.h>

#include <cstdint>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

// The reader wakes a decoder once this many raw samples or bytes are queued unannounced: a
// photo's JPEG (tens of KiB) is announced at once, small images (a 28x28 PNG) in eights.
constexpr int64_t kAnnounceSamples = 8;
constexpr size_t kAnnounceBytes = 16 << 10;

// The cores the calling thread may run on (its affinity mask, which the threads it starts
// inherit); 0 when it cannot be read. (worker/runtime/cpu_affinity.h lists them, but runtime/
// sits above data/; a count is all this needs.)
int ThreadCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

std::string ShapeOf(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// Why field f of a sample cannot stack with the batch's first sample's, or OK.
absl::Status SameShape(int rank, const std::string& key, const std::vector<at::Tensor>& tensors,
                       const std::string& first_key, const std::vector<at::Tensor>& first,
                       size_t f) {
  if (tensors.size() != first.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": sample '", key, "' has ", tensors.size(),
                     " fields after its transforms but sample '", first_key, "' has ", first.size(),
                     "; every sample of a batch needs the same fields"));
  }
  if (!tensors[f].sizes().equals(first[f].sizes()) ||
      tensors[f].scalar_type() != first[f].scalar_type()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": field ", f, " of sample '", key, "' is ",
        c10::toString(tensors[f].scalar_type()), ShapeOf(tensors[f]), " but sample '", first_key,
        "''s is ", c10::toString(first[f].scalar_type()), ShapeOf(first[f]),
        "; a batch stacks equal shapes (give images a common size with data.transforms: "
        "resize, center_crop or random_resized_crop)"));
  }
  return absl::OkStatus();
}

}  // namespace

ShardedSplit::ShardedSplit(ShardedSplitOptions options)
    : options_(std::move(options)), watch_(options_.stuck_after) {}

ShardedSplit::~ShardedSplit() { Stop(); }

void ShardedSplit::SetRank(int rank, int world) {
  Stop();
  rank_ = rank;
  world_ = world;
}

int64_t ShardedSplit::RankSamples() const {
  return RankEpochSamples(options_.catalog.samples, world_, rank_, options_.training);
}

void ShardedSplit::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  if (stream_ != nullptr) stream_->Cancel();
  space_cv_.notify_all();
  raw_cv_.notify_all();
  ready_cv_.notify_all();
}

void ShardedSplit::Stop() {
  Cancel();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  std::unique_ptr<SampleStream> spent;
  std::lock_guard<std::mutex> lock(mu_);
  spent.swap(stream_);  // under mu_: Cancel reads stream_ from other threads
  raw_.clear();
  raw_head_ = 0;
  unannounced_ = 0;
  unannounced_bytes_ = 0;
  ready_.clear();
  slabs_.Clear();
  in_flight_ = 0;
  awaited_ = -1;
  awaited_first_ = awaited_last_ = -1;
  awaited_missing_ = 0;
  reader_asleep_ = false;
  read_done_ = false;
  read_error_ = absl::OkStatus();
  read_end_ = 0;
  stop_ = false;
  running_ = false;
}

std::unique_ptr<SampleStream> ShardedSplit::OpenStream(int64_t epoch, int64_t start) const {
  SampleStreamOptions s;
  s.catalog = &options_.catalog;
  s.fetcher = options_.fetcher;
  s.plan.world = world_;
  s.plan.rank = rank_;
  s.plan.training = options_.training;
  s.plan.shuffle = options_.shuffle;
  s.plan.seed = options_.seed;
  s.plan.epoch = epoch;
  s.shuffle_buffer = options_.shuffle_buffer;
  s.skip_errors = options_.skip_errors;
  s.start = start;
  s.keep_fields = options_.keep_fields;
  return std::make_unique<SampleStream>(std::move(s));
}

void ShardedSplit::Start(int64_t epoch, int64_t position, int64_t batch) {
  Stop();
  // Renumbered (see ReadLoop), the positions before `position` are found by reading from the
  // start, as a replay does anyway.
  std::unique_ptr<SampleStream> stream = OpenStream(epoch, renumber() ? 0 : position);
  {
    std::lock_guard<std::mutex> lock(mu_);  // Cancel reads stream_ from other threads
    stream_ = std::move(stream);
    watch_.Restart(absl::Now());
    slabs_.Reset(position, std::max<int64_t>(1, batch), RankSamples());
  }
  epoch_ = epoch;
  next_ = position;
  base_ = position;
  batch = std::max<int64_t>(1, batch);
  // An evaluation split reads one of its batches ahead (already 4 training batches by default),
  // not prefetch_batches: the worker is not told when an evaluation ends, and one cut short
  // (the sanity check, limit_val_batches) leaves its window decoded until the next begins.
  window_ = std::max<int64_t>(
      {1, options_.window, (options_.training ? options_.prefetch_batches : 1) * batch});
  epoch_samples_ = RankSamples();
  running_ = true;
  // The reader has a thread even with num_workers 0: raw samples (held for a while by the
  // shuffle buffer) then come from its allocator arena, not the step's, whose per-step tensors
  // otherwise fragment the heap so that it grows with the samples read (bench/data_memory.sh).
  //
  // A rank pinned to one core (deploy/local/cluster.sh pins each rank's step thread, and the
  // data threads inherit its mask) gains nothing from decoding threads beside the reader: they
  // cannot run at once, and each hand-off is a lock trip, a futex wake-up and a context switch
  // that preempts the step. There the reader decodes each sample as it reads it. Measured in
  // 2-rank training from 28x28 PNG shards: no slower in 4 of 4 paired jobs (median +2.9%), with
  // a quarter of the data threads' context switches.
  reader_decodes_ = options_.num_workers > 0 && ThreadCores() == 1;
  decoding_threads_ = reader_decodes_ ? 0 : options_.num_workers;
  if (reader_decodes_ && !told_reader_decodes_) {
    told_reader_decodes_ = true;
    LogInfo("the rank runs on one core: its data reader decodes the samples itself",
            {{"split", options_.name}, {"rank", rank_}, {"num_workers", options_.num_workers}});
  }
  threads_.emplace_back([this] {
    pthread_setname_np(pthread_self(), "dtrain-read");
    ReadLoop();
  });
  for (int i = 0; i < decoding_threads_; ++i) {
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "dtrain-decode");
      DecodeLoop();
    });
  }
}

void ShardedSplit::ReadLoop() {
  // Renumbered: the samples that could not be read (a missing shard, a 404, a truncated tar)
  // give up their positions to the next ones, and the epoch's end is padded by reading the
  // rank's sequence again from its start, as DistributedSampler pads, so that every training
  // batch is whole and every rank takes the same steps.
  int64_t read = 0;         // samples read (renumbered: positions given) in this pass and before
  int pass = 0;             // renumbered: passes over the rank's sequence
  bool pass_read = false;   // renumbered: this pass gave a sample
  absl::Status last_error;  // renumbered: the last unreadable sample's error
  std::string logged;       // renumbered: the last error logged (one line per shard, not sample)
  while (true) {
    {
      // A full window puts the reader to sleep until a quarter of it is free again, not until
      // one sample is: waking a thread costs a reschedule interrupt on another core, and one
      // per sample took about a sixth of the CPU (perf, bench/data.sh). Reading a quarter of
      // the window at once only fills the raw queue; the decoders still take one sample a trip.
      std::unique_lock<std::mutex> lock(mu_);
      if (!stop_ && in_flight_ >= window_) {
        Announce(/*all=*/false);
        reader_asleep_ = true;
        space_cv_.wait(lock, [&] { return stop_ || in_flight_ <= RefillAt(); });
        reader_asleep_ = false;
      }
      if (stop_) return;
    }
    absl::StatusOr<std::optional<StreamItem>> item;
    try {
      item = stream_->Next();
      if (renumber() && item.ok() && !item->has_value() && read < epoch_samples_) {
        if (!pass_read) {
          item = absl::DataLossError(absl::StrCat(
              "rank ", rank_, ": no sample of its share of split '", options_.name,
              "' could be read (data.shards.on_error: skip skipped them all); the last error: ",
              last_error.message()));
        } else {
          std::unique_ptr<SampleStream> again = OpenStream(epoch_, 0);
          {
            std::lock_guard<std::mutex> lock(mu_);  // Cancel reads stream_ from other threads
            stream_.swap(again);
          }
          ++pass;
          pass_read = false;
          continue;
        }
      }
    } catch (const std::exception& e) {  // bad_alloc, a thread that cannot start: not a crash
      item = absl::InternalError(absl::StrCat("rank ", rank_, ": reading the ", options_.name,
                                              " shards failed: ", e.what()));
    }
    if (renumber() && item.ok() && item->has_value()) {
      StreamItem& it = **item;
      if (!it.error.ok()) {
        last_error = it.error;
        if (pass == 0 && read >= base_) {
          skipped_.fetch_add(1);
          if (std::string(it.error.message()) != logged) {
            logged = std::string(it.error.message());
            LogWarning("skipped unreadable samples (data.shards.on_error: skip)",
                       {{"split", options_.name},
                        {"rank", rank_},
                        {"key", it.sample.key},
                        {"why", logged}});
          }
        }
        continue;
      }
      pass_read = true;
      it.position = read++;
      if (it.position < base_) continue;  // before the resumed position: read, not handed out
      if (it.position >= epoch_samples_) item = std::optional<StreamItem>();  // the epoch is full
    }
    std::unique_lock<std::mutex> lock(mu_);
    watch_.Progressed(absl::Now());
    if (!item.ok() || !item->has_value()) {
      read_done_ = true;
      if (!item.ok()) read_error_ = item.status();
      raw_cv_.notify_all();
      ready_cv_.notify_all();
      return;
    }
    read_end_ = (*item)->position + 1;
    if (reader_decodes_) {
      // Decoded outside mu_, so that the step can take what is ready meanwhile; only the step
      // may need waking.
      StreamItem& it = **item;
      const int64_t position = it.position;
      std::shared_ptr<Slab> slab = it.error.ok() ? slabs_.Of(position) : nullptr;
      ++in_flight_;
      const int64_t epoch = epoch_;
      lock.unlock();
      Decoded decoded = DecodeItem(std::move(it), epoch, std::move(slab));
      lock.lock();
      const bool wake = Publish(position, std::move(decoded));
      lock.unlock();
      if (wake) ready_cv_.notify_one();
      continue;
    }
    size_t bytes = 0;
    for (const auto& field : (*item)->sample.fields) bytes += field.second.size();
    raw_.push_back(std::move(**item));
    ++in_flight_;
    // The decoders are woken for a few samples at once, not for each: a small image (a 28x28
    // PNG decodes in tens of microseconds) cost nearly as much in wake-ups, each a futex call
    // and a context switch that preempts a step on its core. Measured in 2-rank training from
    // PNG shards: the data threads' share of the cores fell from 9.5% to 8%, and 5 of 6 paired
    // jobs trained faster (median +5%; measured while every job's window was 4 samples, see
    // Start, so not re-measured since). What the decoders have not been told of is announced
    // when the reader sleeps on a full window, when it ends, and at once while the step waits
    // (the reader may block in a slow shard with a few samples unannounced).
    ++unannounced_;
    unannounced_bytes_ += bytes;
    if (unannounced_ >= kAnnounceSamples || unannounced_bytes_ >= kAnnounceBytes || awaited_ >= 0 ||
        awaited_missing_ > 0) {
      Announce(/*all=*/false);
    }
    if (options_.num_workers == 0) ready_cv_.notify_one();  // the step decodes
  }
}

void ShardedSplit::DecodeLoop() {
  while (true) {
    StreamItem item;
    std::shared_ptr<Slab> slab;
    int64_t epoch;
    {
      // Its slab is found in the same trip to mu_: each trip is a chance to wait for the lock,
      // and a waiting thread's wake-up preempts a step on its core.
      std::unique_lock<std::mutex> lock(mu_);
      raw_cv_.wait(lock, [&] { return stop_ || raw_head_ < raw_.size() || read_done_; });
      if (stop_) return;
      if (raw_head_ >= raw_.size()) return;  // read_done_ and nothing left
      item = std::move(raw_[raw_head_++]);
      if (raw_head_ > 1024 && raw_head_ * 2 > raw_.size()) {
        raw_.erase(raw_.begin(), raw_.begin() + static_cast<std::ptrdiff_t>(raw_head_));
        raw_head_ = 0;
      }
      if (item.error.ok()) slab = slabs_.Of(item.position);
      epoch = epoch_;
    }
    const int64_t position = item.position;
    Decoded decoded = DecodeItem(std::move(item), epoch, std::move(slab));
    std::unique_lock<std::mutex> lock(mu_);
    // (Taking several raw samples per trip measured 8% faster alone on one core, and 6% slower
    // in 2-rank training: bursts of decoding skewed the ranks' steps. For 28x28 PNGs, up to 8
    // a trip, 7-14% slower in training than one at a time; both measured while every job's
    // window was 4 samples.)
    const bool wake = Publish(position, std::move(decoded));
    lock.unlock();
    if (wake) ready_cv_.notify_one();
  }
}

bool ShardedSplit::Publish(int64_t position, Decoded decoded) {
  ready_.emplace(position, std::move(decoded));
  // Only the sample the step waits for wakes it, or the last of the batch it waits for.
  bool wake = position == awaited_;
  if (position >= awaited_first_ && position <= awaited_last_ && --awaited_missing_ == 0) {
    wake = true;
  }
  return wake;
}

ShardedSplit::Decoded ShardedSplit::DecodeItem(StreamItem item, int64_t epoch,
                                               std::shared_ptr<Slab> slab) {
  Decoded out;
  out.key = item.sample.key;
  if (!item.error.ok()) {
    out.status = item.error;
    return out;
  }
  const int64_t row = slab == nullptr ? 0 : item.position - slab->first;
  const FieldOutput output = [&](size_t field, at::IntArrayRef sizes, at::ScalarType type) {
    return slab == nullptr ? at::Tensor() : slabs_.Row(*slab, row, field, sizes, type);
  };
  absl::StatusOr<std::vector<at::Tensor>> tensors;
  try {
    tensors =
        GuardTorch("cannot decode the sample", [&]() -> absl::StatusOr<std::vector<at::Tensor>> {
          DTRAIN_ASSIGN_OR_RETURN(std::vector<at::Tensor> fields,
                                  options_.decode(item.sample, epoch, output));
          // Into the slab what the decoder did not write there itself.
          bool in_slab = slab != nullptr;
          for (size_t f = 0; f < fields.size() && in_slab; ++f) {
            at::Tensor target =
                slabs_.Row(*slab, row, f, fields[f].sizes(), fields[f].scalar_type());
            if (!target.defined()) {
              in_slab = false;
              break;
            }
            if (target.data_ptr() != fields[f].data_ptr()) target.copy_(fields[f]);
            fields[f] = std::move(target);
          }
          out.in_slab = in_slab;
          return fields;
        });
  } catch (const std::exception& e) {
    tensors = absl::ResourceExhaustedError(absl::StrCat("decoding failed: ", e.what()));
  }
  if (!tensors.ok()) {
    out.in_slab = false;
    out.status = absl::Status(tensors.status().code(),
                              absl::StrCat("rank ", rank_, ", shard '", item.shard, "', sample '",
                                           item.sample.key, "': ", tensors.status().message()));
    return out;
  }
  out.tensors = std::move(*tensors);
  return out;
}

absl::StatusOr<ShardedSplit::Decoded> ShardedSplit::Take(int64_t position, absl::Time since) {
  std::unique_lock<std::mutex> lock(mu_);
  if (options_.num_workers == 0 && ready_.count(position) == 0) {
    // No decoding threads: the step's thread decodes the next raw sample itself.
    const absl::Time started = absl::Now();
    while (raw_head_ >= raw_.size()) {
      if (stop_ || (options_.cancelled != nullptr && options_.cancelled->load())) {
        return absl::CancelledError("the data stream was stopped");
      }
      if (read_done_) {
        if (!read_error_.ok()) return read_error_;
        return absl::InternalError(absl::StrCat("rank ", rank_, ": the ", options_.name,
                                                " stream ended before position ", position));
      }
      ready_cv_.wait_for(lock, std::chrono::seconds(1));
      if (Stuck(since)) return watch_.Error(rank_, options_.name, position);
    }
    StreamItem item = std::move(raw_[raw_head_++]);
    if (raw_head_ > 1024 && raw_head_ * 2 > raw_.size()) {
      raw_.erase(raw_.begin(), raw_.begin() + static_cast<std::ptrdiff_t>(raw_head_));
      raw_head_ = 0;
    }
    wait_seconds_.store(wait_seconds_.load() + absl::ToDoubleSeconds(absl::Now() - started));
    std::shared_ptr<Slab> slab = item.error.ok() ? slabs_.Of(item.position) : nullptr;
    lock.unlock();
    if (item.position != position) {
      return absl::InternalError(absl::StrCat("rank ", rank_, ": the ", options_.name,
                                              " stream is at position ", item.position, ", not ",
                                              position));
    }
    Decoded d = DecodeItem(std::move(item), epoch_, std::move(slab));
    lock.lock();
    const bool wake = FreeSlot();
    lock.unlock();
    if (wake) space_cv_.notify_one();
    return d;
  }
  auto found = ready_.find(position);
  if (found == ready_.end()) {
    const absl::Time started = absl::Now();
    awaited_ = position;
    Announce(/*all=*/true);
    while ((found = ready_.find(position)) == ready_.end()) {
      if (stop_ || (options_.cancelled != nullptr && options_.cancelled->load())) {
        return absl::CancelledError("the data stream was stopped");
      }
      if (read_done_ && !read_error_.ok() && position >= read_end_) {
        return read_error_;  // the stream failed before it read this position
      }
      if (read_done_ && raw_head_ >= raw_.size() && read_error_.ok() && in_flight_ == 0) {
        return absl::InternalError(absl::StrCat("rank ", rank_, ": the ", options_.name,
                                                " stream ended before position ", position));
      }
      ready_cv_.wait_for(lock, std::chrono::seconds(1));
      if (Stuck(since)) return watch_.Error(rank_, options_.name, position);
    }
    awaited_ = -1;
    wait_seconds_.store(wait_seconds_.load() + absl::ToDoubleSeconds(absl::Now() - started));
  }
  Decoded d = std::move(found->second);
  ready_.erase(found);
  // The reader is woken once mu_ is let go: woken under it, on the step's own core it would
  // preempt the step only to block on mu_ at once (a futex wait and wake per refill).
  const bool wake = FreeSlot();
  lock.unlock();
  if (wake) space_cv_.notify_one();
  return d;
}

std::vector<ShardedSplit::Decoded> ShardedSplit::TakeDecoded(int64_t first, int64_t last) {
  std::vector<Decoded> out;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = ready_.find(first); it != ready_.end() && it->first <= last;) {
      if (it->first != first + static_cast<int64_t>(out.size())) break;
      out.push_back(std::move(it->second));
      it = ready_.erase(it);
      wake = FreeSlot() || wake;
    }
  }
  if (wake) space_cv_.notify_one();
  return out;
}

void ShardedSplit::Announce(bool all) {
  // The step (`all`) wakes every decoder while anything waits to be decoded, even what a
  // decoder was already woken for; the reader only for what none was.
  if (all ? raw_head_ >= raw_.size() : unannounced_ == 0) return;
  if (all) {
    raw_cv_.notify_all();
  } else {
    raw_cv_.notify_one();
  }
  unannounced_ = 0;
  unannounced_bytes_ = 0;
}

bool ShardedSplit::FreeSlot() {
  --in_flight_;
  return reader_asleep_ && in_flight_ <= RefillAt();
}

void ShardedSplit::AwaitBatch(int64_t first, int64_t last, absl::Time since) {
  std::unique_lock<std::mutex> lock(mu_);
  int64_t missing = 0;
  for (int64_t p = first; p <= last; ++p) missing += ready_.count(p) == 0 ? 1 : 0;
  if (missing == 0) return;
  const absl::Time started = absl::Now();
  Announce(/*all=*/true);  // the step waits: every decoder to work
  awaited_first_ = first;
  awaited_last_ = last;
  awaited_missing_ = missing;
  // Anything out of the ordinary (a stop, the stream's end or error, no progress) is left to
  // Take, sample by sample, with its messages.
  while (awaited_missing_ > 0 && !stop_ &&
         !(read_done_ && (!read_error_.ok() || last >= read_end_)) &&
         (options_.cancelled == nullptr || !options_.cancelled->load()) && !Stuck(since)) {
    ready_cv_.wait_for(lock, std::chrono::seconds(1));
  }
  awaited_first_ = awaited_last_ = -1;
  awaited_missing_ = 0;
  wait_seconds_.store(wait_seconds_.load() + absl::ToDoubleSeconds(absl::Now() - started));
}

absl::StatusOr<c10::IValue> ShardedSplit::Batch(int64_t epoch,
                                                const std::vector<int64_t>& positions,
                                                std::vector<int64_t>* kept) {
  if (positions.empty()) return absl::InvalidArgumentError("an index batch needs indices");
  const int64_t n = RankSamples();
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] != positions[0] + static_cast<int64_t>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("split '", options_.name,
                       "' is streamed: a batch is consecutive positions in the rank's epoch, got ",
                       positions[i], " after ", positions[i - 1]));
    }
  }
  if (positions.front() < 0 || positions.back() >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "positions ", positions.front(), "..", positions.back(), " are outside split '",
        options_.name, "' of ", n, " samples on rank ", rank_));
  }
  if (!running_ || epoch != epoch_ || positions.front() != next_) {
    Start(epoch, positions.front(), static_cast<int64_t>(positions.size()));
  }
  // One wake-up for the batch rather than one per sample: the decoders write into its slab,
  // so its rows are of no use to the step before the last one is done.
  // The deadline for a stuck stream counts from here, whichever wait finds it.
  const absl::Time since = absl::Now();
  // Only as much of it as the reader is sure to read before anything is taken: it sleeps on a
  // full window until the window is down to RefillAt(), so positions up to first + RefillAt()
  // are read or will be; past them, a batch as large as the window or larger is taken sample by
  // sample.
  if (options_.num_workers > 0) {
    AwaitBatch(positions.front(), std::min(positions.back(), positions.front() + RefillAt()),
               since);
  }
  std::vector<Decoded> samples;
  samples.reserve(positions.size());
  if (kept != nullptr) kept->clear();
  // Each trip to mu_ is a chance to wait for a reader preempted while holding it on the step's
  // own core: what is decoded already comes in one trip, the rest sample by sample. (With
  // num_workers 0 nothing is decoded ahead.)
  std::vector<Decoded> early;
  if (options_.num_workers > 0) early = TakeDecoded(positions.front(), positions.back());
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i];
    absl::StatusOr<Decoded> d =
        i < early.size() ? absl::StatusOr<Decoded>(std::move(early[i])) : Take(p, since);
    if (!d.ok()) {
      running_ = false;  // the next batch restarts the stream
      return d.status();
    }
    if (!d->status.ok()) {
      if (!options_.skip_errors) {
        running_ = false;
        return d->status;
      }
      skipped_.fetch_add(1);
      LogWarning("skipped a sample (data.shards.on_error: skip)",
                 {{"split", options_.name},
                  {"rank", rank_},
                  {"key", d->key},
                  {"why", std::string(d->status.message())}});
      continue;
    }
    if (kept != nullptr) kept->push_back(p - positions.front());
    samples.push_back(std::move(*d));
  }
  next_ = positions.back() + 1;
  if (samples.empty()) {
    // Evaluation: nothing of this batch counts (the step is skipped, Job::Evaluate). Training
    // cannot take an empty step: its batches only lose samples that failed to decode, and
    // this one lost all of them.
    if (!options_.training) return c10::IValue();
    return absl::DataLossError(absl::StrCat("rank ", rank_, ": every sample of the ", options_.name,
                                            " batch at positions ", positions.front(), "..",
                                            positions.back(), " failed to decode"));
  }
  // This batch's slab, when it is exactly this batch; the slabs it finishes are let go.
  std::shared_ptr<Slab> slab;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slab = slabs_.Finish(positions.front(), positions.back());
  }
  return Collate(std::move(samples), slab, positions.size());
}

absl::StatusOr<c10::IValue> ShardedSplit::Collate(std::vector<Decoded> samples,
                                                  const std::shared_ptr<Slab>& slab,
                                                  size_t expected) {
  const size_t fields = samples.front().tensors.size();
  bool whole = slab != nullptr && samples.size() == expected && slab->columns.size() == fields;
  for (size_t i = 0; i < samples.size() && whole; ++i) whole = samples[i].in_slab;
  std::vector<c10::IValue> columns;
  if (whole) {
    // Every row written in place: the slab is the batch.
    for (const at::Tensor& c : slab->columns) columns.emplace_back(c);
    slabs_.Lend(slab->columns);
  } else {
    // Some rows are missing (skipped samples) or were not written in place: copied.
    absl::Status shapes;
    for (size_t f = 0; f < fields && shapes.ok(); ++f) {
      for (const Decoded& d : samples) {
        shapes =
            SameShape(rank_, d.key, d.tensors, samples.front().key, samples.front().tensors, f);
        if (!shapes.ok()) break;
      }
    }
    if (!shapes.ok()) return shapes;
    absl::StatusOr<std::vector<c10::IValue>> stacked =
        GuardTorch("cannot collate the batch", [&]() -> absl::StatusOr<std::vector<c10::IValue>> {
          std::vector<c10::IValue> out;
          for (size_t f = 0; f < fields; ++f) {
            std::vector<at::Tensor> parts;
            parts.reserve(samples.size());
            for (const Decoded& d : samples) parts.push_back(d.tensors[f]);
            out.emplace_back(at::stack(parts, 0));
          }
          return out;
        });
    if (!stacked.ok()) return stacked.status();
    columns = *std::move(stacked);
  }
  if (columns.size() == 1) return columns.front();
  return c10::IValue(c10::ivalue::Tuple::create(std::move(columns)));
}

}  // namespace dtrain

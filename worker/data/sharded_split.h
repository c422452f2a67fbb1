// One split of a sharded dataset as a rank streams it: its raw samples (sample_stream.h) decoded
// by a pool of threads (data.num_workers; on a rank with one core, by its reader) a bounded
// window ahead of the step, and collated into batches. The coordinator addresses a streamed split's
// samples by position in the rank's epoch (0, 1, 2, ...), so the same batch of the same epoch holds
// the same samples on every run; a batch that does not continue where the last one ended (a resume,
// a re-sent step, a new epoch) restarts the stream there.
//
// Whichever thread decodes a sample writes it into its row of the batch it belongs to (a "slab",
// batch_slabs.h), so a batch is handed to the step without a copy, and the step's thread does no
// collation. A wait for a sample ends with an error when the stream stalls (stuck_stream_watch.h).
//
// Memory: the window (prefetch_batches x batch size decoded samples when training, one batch
// otherwise, at least two per thread) rounded up to whole batches plus one, the batches the step
// still holds, the shuffle buffer's raw samples and one shard being read, whatever the dataset's
// size.
//
// Thread-safety: Batch from one thread at a time (the rank's step thread); Cancel from any.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/data/batch_slabs.h"
#include "worker/data/sample_stream.h"
#include "worker/data/stuck_stream_watch.h"

namespace dtrain {

// Where a decoder may write field `field`'s tensor of `sizes` and `type`: that field's row of
// the batch the sample will be collated into, so the batch needs no copy. An undefined tensor
// when it cannot (a shape that differs from the batch's other samples').
using FieldOutput =
    std::function<at::Tensor(size_t field, at::IntArrayRef sizes, at::ScalarType type)>;

// A raw sample's tensors, one per batch field; `epoch` seeds its augmentations. A decoder may
// write a field into `output`'s tensor and return that; what it returns otherwise is copied.
using SampleDecoder = std::function<absl::StatusOr<std::vector<at::Tensor>>(
    const ShardSample& sample, int64_t epoch, const FieldOutput& output)>;

struct ShardedSplitOptions {
  std::string name;  // "train", for messages
  ShardCatalog catalog;
  ShardFetcher fetcher;
  bool training = false;
  bool shuffle = true;
  uint64_t seed = 0;
  size_t shuffle_buffer = 0;
  bool skip_errors = false;
  int num_workers = 2;
  // Samples read and decoded ahead of the step: at least `window`, and at least
  // prefetch_batches of the step's batches when training, one batch otherwise (their size is
  // known from the first Batch: the coordinator, not the spec a worker gets, holds the batch
  // size). 0: `window` alone.
  int64_t window = 64;
  int prefetch_batches = 0;
  SampleDecoder decode;
  std::set<std::string> keep_fields;  // the fields `decode` reads (empty: all); see SampleStream
  // A batch's wait for samples ends (CANCELLED) when this becomes true (the job's cancel).
  const std::atomic<bool>* cancelled = nullptr;
  // A wait for a sample fails (DEADLINE_EXCEEDED) after this long without the stream reading
  // a sample (a replayed one included) or downloading a mebibyte of a shard over http(s): far
  // above any decode, and above the HTTP fetcher's own stall timeout, so that its precise
  // error comes first. Checked about once a second.
  absl::Duration stuck_after = absl::Minutes(10);
};

class ShardedSplit {
 public:
  explicit ShardedSplit(ShardedSplitOptions options);
  ~ShardedSplit();
  ShardedSplit(const ShardedSplit&) = delete;
  ShardedSplit& operator=(const ShardedSplit&) = delete;

  // Which rank of how many reads it; before the first Batch.
  void SetRank(int rank, int world);
  // The samples this rank reads per epoch.
  int64_t RankSamples() const;
  int64_t TotalSamples() const { return options_.catalog.samples; }

  // The samples at `positions` of the rank's epoch `epoch` (consecutive, ascending), collated:
  // one stacked tensor per field, a tuple when there are several. INVALID_ARGUMENT for positions
  // that are not consecutive or beyond the epoch; the stream's or a decoder's error, naming the
  // rank, the shard and the sample; CANCELLED after Cancel.
  //
  // With on_error skip, a training split's positions count only the samples that could be
  // read, padded at the epoch's end from its start (every batch whole unless a sample fails to
  // decode); an evaluation split's batch loses the samples it skips, and is None when it loses
  // all. `kept`, when given, receives the offsets within `positions` of the rows returned.
  absl::StatusOr<c10::IValue> Batch(int64_t epoch, const std::vector<int64_t>& positions,
                                    std::vector<int64_t>* kept = nullptr);
  void Cancel();

  int64_t skipped() const { return skipped_.load(); }
  // The decoding threads the running epoch started: data.num_workers, or 0 when the reader
  // decodes what it reads (the rank may run on one core only; see Start) or the step does
  // (num_workers 0). From the step's thread.
  int decoding_threads() const { return decoding_threads_; }
  // The samples the running epoch reads ahead of the step (ShardedSplitOptions::window); 0
  // before the first Batch and after a Batch that failed. From the step's thread.
  int64_t window() const { return running_ ? window_ : 0; }
  // Time Batch spent waiting for samples that were not decoded yet (input-bound).
  double wait_seconds() const { return wait_seconds_.load(); }

 private:
  using Slab = BatchSlabs::Slab;
  struct Decoded {
    absl::Status status;  // a sample that failed (skipped when on_error is skip)
    std::string key;
    std::vector<at::Tensor> tensors;  // views of its slab's rows when in_slab
    bool in_slab = false;
  };
  // Training with on_error skip: positions count the samples that could be read (ReadLoop).
  bool renumber() const { return options_.training && options_.skip_errors; }
  std::unique_ptr<SampleStream> OpenStream(int64_t epoch, int64_t start) const;
  void Start(int64_t epoch, int64_t position, int64_t batch);
  void Stop();
  void ReadLoop();
  void DecodeLoop();
  // mu_ held: `decoded` is ready at `position`. True when the step waits for it: the caller
  // wakes it (ready_cv_) once it has let go of mu_.
  bool Publish(int64_t position, Decoded decoded);
  // `slab`: the one `item`'s position is written into (BatchSlabs::Of), or null.
  Decoded DecodeItem(StreamItem item, int64_t epoch, std::shared_ptr<Slab> slab);
  // The samples of positions first..last that are decoded, from `first` on up to the first
  // that is not, in one trip to mu_ (the step's trips are its chances to wait for the reader).
  std::vector<Decoded> TakeDecoded(int64_t first, int64_t last);
  // A stream Stuck since `since` fails the wait.
  absl::StatusOr<Decoded> Take(int64_t position, absl::Time since);
  // Waits until positions first..last are all decoded, or until anything Take reports.
  void AwaitBatch(int64_t first, int64_t last, absl::Time since);
  // mu_ held: a taken sample leaves the window. True when that wakes the reader: the caller
  // notifies space_cv_ once it has let go of mu_.
  bool FreeSlot();
  // mu_ held: wakes a decoder for the raw samples the reader queued without waking one; `all`
  // (the step, as it begins to wait) wakes every decoder while any raw sample is queued.
  void Announce(bool all);
  // mu_ held: whether the stream made no progress for stuck_after (StuckStreamWatch).
  bool Stuck(absl::Time since) { return watch_.Stuck(stream_.get(), since, absl::Now()); }
  // The reader, asleep on a full window, wakes when in_flight_ is down to this (mu_ held).
  int64_t RefillAt() const { return window_ - std::max<int64_t>(1, window_ / 4); }
  absl::StatusOr<c10::IValue> Collate(std::vector<Decoded> samples,
                                      const std::shared_ptr<Slab>& slab, size_t expected);

  const ShardedSplitOptions options_;
  int rank_ = 0;
  int world_ = 1;
  std::atomic<int64_t> skipped_{0};
  std::atomic<double> wait_seconds_{0};

  // The running pipeline of one epoch from one position.
  bool running_ = false;
  int decoding_threads_ = 0;
  int64_t window_ = 1;           // the running epoch's (see ShardedSplitOptions::window)
  bool reader_decodes_ = false;  // the reader decodes each sample as it reads it
  bool told_reader_decodes_ = false;
  int64_t epoch_ = -1;
  int64_t next_ = 0;  // the position the next Batch should start at
  std::unique_ptr<SampleStream> stream_;
  std::mutex mu_;
  std::condition_variable space_cv_;  // the reader waits for room in the window
  std::condition_variable raw_cv_;    // the decoders wait for raw samples
  std::condition_variable ready_cv_;  // the step waits for decoded ones
  bool stop_ = false;                 // guarded by mu_
  std::vector<StreamItem> raw_;       // read, not yet decoded (a FIFO; guarded by mu_)
  size_t raw_head_ = 0;
  // Raw samples queued since the decoders were last woken, and their bytes (guarded by mu_).
  int64_t unannounced_ = 0;
  size_t unannounced_bytes_ = 0;
  std::map<int64_t, Decoded> ready_;  // decoded, by position (guarded by mu_)
  int64_t in_flight_ = 0;             // read and not yet taken (guarded by mu_)
  int64_t awaited_ = -1;              // the position the step waits for (guarded by mu_)
  // The batch the step waits for as a whole, and how many of its positions are not decoded
  // yet (guarded by mu_).
  int64_t awaited_first_ = -1;
  int64_t awaited_last_ = -1;
  int64_t awaited_missing_ = 0;
  bool reader_asleep_ = false;  // on a full window (guarded by mu_)
  bool read_done_ = false;      // guarded by mu_
  absl::Status read_error_;     // guarded by mu_
  int64_t read_end_ = 0;        // the position after the last read (guarded by mu_)
  StuckStreamWatch watch_;      // guarded by mu_
  int64_t base_ = 0;            // the position the stream started at
  int64_t epoch_samples_ = 0;
  BatchSlabs slabs_;  // the batches being written (Reset, Of, Finish, Clear: under mu_)
  std::vector<std::thread> threads_;
};

}  // namespace dtrain

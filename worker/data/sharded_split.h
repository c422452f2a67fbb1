// One split of a sharded dataset as a rank streams it: its raw samples (sample_stream.h) decoded
// by a pool of threads (data.num_workers) a bounded window ahead of the step, and collated into
// batches. The coordinator addresses a streamed split's samples by position in the rank's epoch
// (0, 1, 2, ...), so the same batch of the same epoch holds the same samples on every run; a
// batch that does not continue where the last one ended (a resume, a re-sent step, a new epoch)
// restarts the stream there.
//
// Memory: the window (prefetch_batches x batch size decoded samples, at least two per thread),
// the shuffle buffer's raw samples and one shard being read, whatever the dataset's size.
//
// Thread-safety: Batch from one thread at a time (the rank's step thread); Cancel from any.
#pragma once

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
#include "absl/time/time.h"
#include "worker/data/sample_stream.h"

namespace dtrain {

// A raw sample's tensors, one per batch field; `epoch` seeds its augmentations.
using SampleDecoder = std::function<absl::StatusOr<std::vector<at::Tensor>>(
    const ShardSample& sample, int64_t epoch)>;

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
  int64_t window = 64;  // decoded samples ahead of the step
  SampleDecoder decode;
  std::set<std::string> keep_fields;  // the fields `decode` reads (empty: all); see SampleStream
  // A batch's wait for samples ends (CANCELLED) when this becomes true (the job's cancel).
  const std::atomic<bool>* cancelled = nullptr;
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
  absl::StatusOr<c10::IValue> Batch(int64_t epoch, const std::vector<int64_t>& positions);
  void Cancel();

  int64_t skipped() const { return skipped_.load(); }
  // Time Batch spent waiting for samples that were not decoded yet (input-bound).
  double wait_seconds() const { return wait_seconds_.load(); }

 private:
  struct Decoded {
    absl::Status status;  // a sample that failed (skipped when on_error is skip)
    std::string key;
    std::vector<at::Tensor> tensors;
  };
  void Start(int64_t epoch, int64_t position);
  void Stop();
  void ReadLoop();
  void DecodeLoop();
  Decoded DecodeItem(StreamItem item, int64_t epoch) const;
  absl::StatusOr<Decoded> Take(int64_t position);

  const ShardedSplitOptions options_;
  int rank_ = 0;
  int world_ = 1;
  std::atomic<int64_t> skipped_{0};
  std::atomic<double> wait_seconds_{0};

  // The running pipeline of one epoch from one position.
  bool running_ = false;
  int64_t epoch_ = -1;
  int64_t next_ = 0;  // the position the next Batch should start at
  std::unique_ptr<SampleStream> stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;            // guarded by mu_
  std::vector<StreamItem> raw_;  // read, not yet decoded (a FIFO; guarded by mu_)
  size_t raw_head_ = 0;
  std::map<int64_t, Decoded> ready_;  // decoded, by position (guarded by mu_)
  int64_t in_flight_ = 0;             // read and not yet taken (guarded by mu_)
  int64_t taken_ = 0;                 // positions handed out (guarded by mu_)
  bool read_done_ = false;            // guarded by mu_
  absl::Status read_error_;           // guarded by mu_
  int64_t read_end_ = 0;              // the position after the last read (guarded by mu_)
  absl::Time last_progress_;          // when the reader last produced (guarded by mu_)
  std::vector<std::thread> threads_;
  // The last batch's stacked fields, reused for the next batch once nobody else holds them: a
  // fresh 38 MB batch (64 x 3x224x224 floats) is an mmap whose page faults cost 5x the copy.
  std::vector<at::Tensor> last_columns_;  // step thread only
};

}  // namespace dtrain

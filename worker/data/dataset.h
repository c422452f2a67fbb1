// Datasets a worker loads itself, so that a step RPC can carry sample indices instead of
// tensors (a few bytes per sample instead of 3 KiB). Each has a split "train" and optionally
// "val", "test" and "predict"; a batch has its split's structure with the selected rows.
//   builtin "fashion-mnist"  the gzip IDX files of Debian's dataset-fashion-mnist; batches are
//                            (x, y): x [N, 1, 28, 28] float32 normalized with the training set's
//                            mean and std (0.2860, 0.3530), y int64; "val" is the last
//                            data.val_size training images, "train" the rest
//   synthetic                learnable 28x28 images (class c brightens rows 2c..2c+2) plus noise,
//                            generated from a seed: every worker makes the same data; (x, y)
//   tensors_file             a file written by Python's torch.save: {"train": (x, y), ...}, each
//                            split a tuple or list of tensors, a dict of named tensors, or one
//                            tensor, all with the same length in dimension 0. Normalized only
//                            when DataConfig.normalize says so. The older libtorch archive with
//                            "<split>/x" and "<split>/y" is still read (as (x, y)).
//   shards                   WebDataset tar shards, streamed (sharded_split.h): a split is read
//                            by position in the rank's epoch, never held whole.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"
#include "dtrain/v1/job_spec.pb.h"
#include "worker/data/shard_catalog.h"

namespace dtrain {

class ShardedSplit;

struct DataLoadOptions {
  uint64_t seed = 0;     // seed_everything: shard order, shuffle buffer, augmentations
  ShardFetcher fetcher;  // how shards are reached
  // A streamed batch's wait for data ends (CANCELLED) when this becomes true.
  const std::atomic<bool>* cancelled = nullptr;
  // Load's own downloads (shard lists) end (CANCELLED) when this becomes true: the job's Setup
  // was cancelled.
  const std::atomic<bool>* load_cancelled = nullptr;
};

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

class Dataset {
 public:
  struct Split {
    // A tuple, List[Tensor] or Dict[str, Tensor] of tensors with `size` rows, or one tensor.
    c10::IValue columns;
    int64_t size = 0;
  };

  // NOT_FOUND: a file is missing (the message names the Debian package for the builtin).
  // INVALID_ARGUMENT: a malformed file or spec.
  // `spec` is the job spec's data section (job_spec.proto); a val_size of 0 is its default.
  static absl::StatusOr<std::unique_ptr<Dataset>> Load(const v1::DataConfig& spec,
                                                       const DataLoadOptions& options = {});
  ~Dataset();

  // (name, size) of each split, in the order train, val, test, predict; a streamed split's
  // size is its whole sample count (each rank reads its part: epoch_plan.h).
  std::vector<std::pair<std::string, int64_t>> Splits() const;
  bool Streamed(const std::string& split) const { return streamed_.count(split) > 0; }
  // Which rank of how many reads the streamed splits (rank 0 of 1 until told).
  void SetRank(int rank, int world);
  // INVALID_ARGUMENT: unknown split, no indices, or an index out of range (named). A streamed
  // split's indices are consecutive positions in the rank's epoch `epoch`.
  // const: a streamed split's stream is the split's own state, not the dataset's.
  // With on_error skip, a streamed evaluation batch can lose samples: `kept`, when given, then
  // receives the offsets in `indices` of the rows returned, and a batch that lost them all is
  // None (sharded_split.h). Otherwise `kept` is left empty.
  absl::StatusOr<c10::IValue> Batch(const std::string& split, const std::vector<int64_t>& indices,
                                    int64_t epoch = 0, std::vector<int64_t>* kept = nullptr) const;
  // Streamed samples skipped (data.shards.on_error: skip), and the time steps waited for data.
  int64_t skipped() const;
  double wait_seconds() const;
  // The samples streamed split `split` reads ahead of the step (ShardedSplit::window); 0 for
  // a split that is not streamed, has not served a batch yet, or whose last batch failed.
  int64_t ReadAhead(const std::string& split) const;

  // The synthetic data's samples, for tests that compare against tensors sent by hand.
  static std::pair<at::Tensor, at::Tensor> Synthetic(int64_t n, uint64_t seed);

 private:
  static absl::StatusOr<Split> CheckSplit(const std::string& path, const std::string& name,
                                          const c10::IValue& value);
  absl::Status LoadTensorsFile(const std::string& path);

  std::map<std::string, Split> splits_;
  std::map<std::string, std::unique_ptr<ShardedSplit>> streamed_;
  bool fashion_normalize_ = false;  // builtin: uint8 x scaled with Fashion-MNIST's statistics
  std::optional<v1::Normalize> normalize_;
};

}  // namespace dtrain

// Datasets a worker loads itself, so that a step RPC can carry sample indices instead of
// tensors (a few bytes per sample instead of 3 KiB). Each has splits "train", "val" (optional)
// and "test" (optional), whose samples are (x, y) pairs; a batch is the tuple (x[idx], y[idx]).
//   builtin "fashion-mnist"  the gzip IDX files of Debian's dataset-fashion-mnist; x is
//                            [N, 1, 28, 28] float32 normalized with the training set's mean
//                            and std (0.2860, 0.3530), y int64; "val" is the last val_size
//                            training images (default 5,000), "train" the rest
//   synthetic                learnable 28x28 images (class c brightens rows 2c..2c+2) plus noise,
//                            generated from a seed: every worker makes the same data
//   tensors_file             a torch archive with "<split>/x" and "<split>/y"
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

class Dataset {
 public:
  // NOT_FOUND: a file is missing (the message names the Debian package for the builtin).
  // INVALID_ARGUMENT: a malformed file or spec.
  static absl::StatusOr<std::unique_ptr<Dataset>> Load(const v1::DataSpec& spec);

  // (name, size) of each split, in the order train, val, test.
  std::vector<std::pair<std::string, int64_t>> Splits() const;
  // INVALID_ARGUMENT: unknown split, no indices, or an index out of range (named).
  absl::StatusOr<c10::IValue> Batch(const std::string& split,
                                    const std::vector<int64_t>& indices) const;

  // The synthetic data's samples, for tests that compare against tensors sent by hand.
  static std::pair<at::Tensor, at::Tensor> Synthetic(int64_t n, uint64_t seed);

 private:
  struct Split {
    at::Tensor x;  // uint8 images are normalized when a batch is made
    at::Tensor y;
  };
  std::map<std::string, Split> splits_;
};

}  // namespace dtrain

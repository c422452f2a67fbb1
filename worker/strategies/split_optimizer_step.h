// ddp's optimizer step split between the ranks of a shared-memory group
// (trainer.split_optimizer_step): each rank runs torch's own optimizer (SGD, Adam, AdamW, RMSprop
// or Adagrad) over its part of every gradient bucket right after reducing that part, and the
// plane copies the new values into the other ranks' parameters
// (CollectiveBackend::AllReduceThenUpdate). A rank so steps 1/world of the parameters and keeps
// state (momentum, Adam's averages) for that part only, and every rank still ends the step
// holding every parameter bitwise as an unsplit step leaves it: these optimizers update an
// element from that element's gradient, value and state alone (ElementwiseOptimizer), and the
// same kernels compute it.
//
// The strategy's optimizer (`full`) stays the one schedulers set rates on and checkpoints read:
// each step copies its groups' options to the parts, Consolidate gathers the parts' state into
// its state, and after a restore into it Reset makes the parts take their state from it.
//
// Thread-safety: the step thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/collectives/collective_backend.h"
#include "worker/strategies/elementwise_optimizer.h"
#include "worker/strategies/gradient_sync.h"

namespace dtrain {

class SplitOptimizerStep {
 public:
  // Whether `optimizer`'s step can be split by elements: libtorch's own SGD, Adam, AdamW,
  // RMSprop or Adagrad, with any of their options.
  static bool Splits(const torch::optim::Optimizer& optimizer);

  // `sync` holds its parameters beside its buckets (GradientSync::PlaceParametersBesideBuckets)
  // and `full` (one that Splits) steps some of them; both outlive this. `parameters` are sync's,
  // in its order.
  SplitOptimizerStep(torch::optim::Optimizer* full, const GradientSync* sync,
                     std::vector<torch::Tensor> parameters);

  // Steps elements [begin, end) of bucket `bucket` (GradientSync::BucketUpdate).
  absl::Status Update(size_t bucket, int64_t begin, int64_t end);

  // Puts every parameter's state into the full optimizer's, as an unsplit step leaves it (for a
  // checkpoint). A collective: every rank calls it, under GuardTorch (libtorch may throw).
  absl::Status Consolidate(CollectiveBackend* backend);

  // After a restore into the full optimizer: the parts take their state from it at their next
  // step.
  void Reset() { parts_.clear(); }

 private:
  // A parameter's elements in a part: elements [from, from + count) of the parameter, at
  // element `at` of the part's run `run`.
  struct Slice {
    size_t parameter;  // index into parameters_
    int64_t from = 0;
    int64_t count = 0;
    size_t run = 0;
    int64_t at = 0;
  };
  // What the part's optimizer steps: consecutive slices of one group of the full optimizer, with
  // the same state restored into them (none, or the same tensors and step count), as one tensor
  // over their elements (its .grad: the bucket's). One parameter of the part's optimizer costs a
  // step a few ATen calls whatever its size, and a bucket's small parameters (a model's last
  // layers and biases) lie together at one end of it.
  struct Run {
    torch::Tensor value;
    int group = 0;                 // the full optimizer's
    int64_t begin = 0, count = 0;  // its elements in the bucket
  };
  struct Part {
    size_t bucket = 0;
    int64_t begin = 0, end = 0;
    std::vector<Slice> slices;
    std::vector<Run> runs;
    std::vector<size_t> groups;  // per group of `optimizer`: the full optimizer's group
    std::unique_ptr<torch::optim::Optimizer> optimizer;  // null: nothing here is stepped
  };
  absl::StatusOr<Part*> PartFor(size_t bucket, int64_t begin, int64_t end);

  torch::optim::Optimizer* const full_;
  const ElementwiseOptimizer* const kind_;  // full_'s
  const GradientSync* const sync_;
  std::vector<torch::Tensor> parameters_;
  std::vector<int> group_of_;  // per parameter: its group in full_, -1 if full_ does not step it
  std::vector<Part> parts_;
};

}  // namespace dtrain

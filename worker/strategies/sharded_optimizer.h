// ZeRO stage 1 over the coordinator: the optimizer's state is partitioned across ranks. Each
// parameter belongs to one rank (greedy by size, so partitions are balanced); after gradients
// are averaged (GradientSync), every rank steps only the parameters it owns, holding optimizer
// state for those alone, and the owners then broadcast the updated values to the others.
//
// Thread-safety: one thread at a time (it issues collectives in order).
#pragma once

#include <memory>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "worker/collectives/collective_backend.h"
#include "worker/model/optimizers.h"

namespace dtrain {

class ShardedOptimizer {
 public:
  // Every rank must pass the same parameter list and config.
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Make(
      CollectiveBackend* backend, std::vector<torch::Tensor> parameters,
      const OptimizerConfig& config);

  void ZeroGrad();
  // Steps this rank's partition, then shares every partition from its owner.
  absl::Status Step();

  // Sets the learning rate of every parameter group (each rank's partition).
  void SetLearningRate(double lr);
  // Sets each group's rates (a partition has the full optimizer's groups).
  void SetGroupRates(const std::vector<GroupRates>& rates);

  // optimizer_state for checkpoints: gathers every partition's state to rank dst, which gets
  // an optimizer over all parameters holding it (in the plain optimizer's archive format, so
  // the checkpoint loads into any strategy and world size); the other ranks get null.
  // A collective: every rank must call it.
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> Consolidate(int dst);
  // Keeps, from an optimizer over all parameters (a restored checkpoint), the state of the
  // parameters this rank owns.
  absl::Status AdoptState(torch::optim::Optimizer& full);

  // Owner rank of each parameter, in parameter order.
  const std::vector<int>& owners() const { return owners_; }
  // The parameters whose optimizer state this rank holds.
  size_t local_parameter_count() const { return local_.size(); }

 private:
  ShardedOptimizer() = default;

  CollectiveBackend* backend_ = nullptr;
  OptimizerConfig config_;
  std::vector<torch::Tensor> parameters_;
  std::vector<int> owners_;
  std::vector<torch::Tensor> local_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // over local_ only
};

}  // namespace dtrain

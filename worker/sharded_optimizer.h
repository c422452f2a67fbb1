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
#include "client/process_group.h"
#include "worker/optimizers.h"

namespace dtrain {

class ShardedOptimizer {
 public:
  // Every rank must pass the same parameter list and config.
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Make(
      ProcessGroup* group, std::vector<torch::Tensor> parameters, const OptimizerConfig& config);

  void ZeroGrad();
  // Steps this rank's partition, then shares every partition from its owner.
  absl::Status Step();

  // Owner rank of each parameter, in parameter order.
  const std::vector<int>& owners() const { return owners_; }
  // The parameters whose optimizer state this rank holds.
  size_t local_parameter_count() const { return local_.size(); }

 private:
  ShardedOptimizer() = default;

  ProcessGroup* group_ = nullptr;
  std::vector<torch::Tensor> parameters_;
  std::vector<int> owners_;
  std::vector<torch::Tensor> local_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // over local_ only
};

}  // namespace dtrain

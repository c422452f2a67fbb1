#include "worker/sharded_optimizer.h"

#include <algorithm>
#include <numeric>

#include <torch/torch.h>

#include "common/status_macros.h"
#include "worker/gradient_sync.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Make(
    ProcessGroup* group, std::vector<torch::Tensor> parameters, const OptimizerConfig& config) {
  std::unique_ptr<ShardedOptimizer> sharded(new ShardedOptimizer());
  sharded->group_ = group;
  sharded->parameters_ = std::move(parameters);
  const int world = group->world_size();
  // Largest parameters first, each to the least loaded rank; ties by lower rank. The result
  // depends only on the shapes, so every rank computes the same assignment.
  std::vector<size_t> order(sharded->parameters_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return sharded->parameters_[a].numel() > sharded->parameters_[b].numel();
  });
  std::vector<int64_t> load(world, 0);
  sharded->owners_.assign(sharded->parameters_.size(), 0);
  for (size_t i : order) {
    const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    sharded->owners_[i] = owner;
    load[owner] += sharded->parameters_[i].numel();
  }
  for (size_t i = 0; i < sharded->parameters_.size(); ++i) {
    if (sharded->owners_[i] == group->rank()) sharded->local_.push_back(sharded->parameters_[i]);
  }
  // A rank may own nothing (fewer parameters than ranks); it then steps nothing.
  if (!sharded->local_.empty()) {
    DTRAIN_ASSIGN_OR_RETURN(sharded->optimizer_, MakeOptimizer(sharded->local_, config));
  } else {
    DTRAIN_RETURN_IF_ERROR(MakeOptimizer({torch::zeros({1})}, config).status());
  }
  return sharded;
}

void ShardedOptimizer::ZeroGrad() {
  for (torch::Tensor& p : parameters_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

absl::Status ShardedOptimizer::Step() {
  if (optimizer_ != nullptr) optimizer_->step();
  // Each owner shares its updated parameters: one packed broadcast per owner.
  for (int owner = 0; owner < group_->world_size(); ++owner) {
    std::vector<torch::Tensor> owned;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] == owner) owned.push_back(parameters_[i]);
    }
    if (!owned.empty()) DTRAIN_RETURN_IF_ERROR(BroadcastTensors(group_, owned, owner));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

#include "worker/strategies/sharded_optimizer.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include "common/status_macros.h"
#include "worker/model/torch_status.h"
#include "worker/strategies/gradient_sync.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Make(
    CollectiveBackend* backend, std::vector<torch::Tensor> parameters,
    const OptimizerConfig& config) {
  std::unique_ptr<ShardedOptimizer> sharded(new ShardedOptimizer());
  sharded->backend_ = backend;
  sharded->config_ = config;
  sharded->parameters_ = std::move(parameters);
  const int world = backend->world_size();
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
    if (sharded->owners_[i] == backend->rank()) sharded->local_.push_back(sharded->parameters_[i]);
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
  for (int owner = 0; owner < backend_->world_size(); ++owner) {
    std::vector<torch::Tensor> owned;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] == owner) owned.push_back(parameters_[i]);
    }
    if (!owned.empty()) DTRAIN_RETURN_IF_ERROR(BroadcastTensors(backend_, owned, owner));
  }
  return absl::OkStatus();
}

void ShardedOptimizer::SetLearningRate(double lr) {
  if (optimizer_ == nullptr) return;
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
}

void ShardedOptimizer::SetGroupRates(const std::vector<GroupRates>& rates) {
  if (optimizer_ != nullptr) WriteGroupRates(*optimizer_, rates);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> ShardedOptimizer::Consolidate(int dst) {
  // Each rank's partition travels as its optimizer's own archive (what optimizer.save
  // writes), so every optimizer kind is handled by libtorch's serialization, not by us.
  std::string bytes;
  if (optimizer_ != nullptr) {
    DTRAIN_RETURN_IF_ERROR(GuardTorch("cannot serialize optimizer state", [&]() -> absl::Status {
      torch::serialize::OutputArchive archive;
      optimizer_->save(archive);
      std::ostringstream out;
      archive.save_to(out);
      bytes = out.str();
      return absl::OkStatus();
    }));
  }
  torch::Tensor mine = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> parts, backend_->AllGather(mine));
  if (backend_->rank() != dst) return std::unique_ptr<torch::optim::Optimizer>();
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> full,
                          MakeOptimizer(parameters_, config_));
  if (optimizer_ != nullptr) {
    // Learning rates and other group options as this rank's optimizer has them now.
    full->param_groups().front().set_options(optimizer_->param_groups().front().options().clone());
  }
  for (int rank = 0; rank < static_cast<int>(parts.size()); ++rank) {
    if (parts[rank].numel() == 0) continue;
    std::vector<torch::Tensor> owned;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] == rank) owned.push_back(parameters_[i]);
    }
    DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> partial,
                            MakeOptimizer(owned, config_));
    DTRAIN_RETURN_IF_ERROR(GuardTorch(
        absl::StrCat("cannot read rank ", rank, "'s optimizer state"), [&]() -> absl::Status {
          torch::serialize::InputArchive archive;
          // Onto this rank's device: the bytes were written on `rank`'s.
          archive.load_from(static_cast<const char*>(parts[rank].data_ptr()),
                            static_cast<size_t>(parts[rank].numel()),
                            owned.empty() ? c10::Device(c10::kCPU) : owned.front().device());
          partial->load(archive);
          return absl::OkStatus();
        }));
    for (const torch::Tensor& p : owned) {
      auto it = partial->state().find(OptimizerStateKey(p));
      if (it != partial->state().end()) full->state()[OptimizerStateKey(p)] = it->second->clone();
    }
  }
  return full;
}

absl::Status ShardedOptimizer::AdoptState(torch::optim::Optimizer& full) {
  if (optimizer_ == nullptr) return absl::OkStatus();
  optimizer_->state().clear();
  for (const torch::Tensor& p : local_) {
    auto it = full.state().find(OptimizerStateKey(p));
    if (it != full.state().end()) optimizer_->state()[OptimizerStateKey(p)] = it->second->clone();
  }
  if (!full.param_groups().empty()) {
    optimizer_->param_groups().front().set_options(full.param_groups().front().options().clone());
  }
  return absl::OkStatus();
}

}  // namespace dtrain

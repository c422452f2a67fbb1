// ddp and sharded (ZeRO stage 1): one rank per process over a CollectiveBackend. At setup every
// rank's parameters and buffers become rank 0's; after backward the gradients are averaged in
// buckets (GradientSync), except while accumulating. sharded additionally partitions the
// optimizer state (ShardedOptimizer) and consolidates it on rank 0 for checkpoints.
#pragma once

#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "worker/strategies/gradient_sync.h"
#include "worker/strategies/sharded_optimizer.h"
#include "worker/strategies/split_optimizer_step.h"
#include "worker/strategies/strategy.h"

namespace dtrain {

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(StrategyOptions options, std::unique_ptr<CollectiveBackend> backend)
      : Strategy(std::move(options), std::move(backend)) {}

  std::string name() const override { return options_.name; }
  absl::Status Setup(LightningModule* model, const OptimizerConfig& optimizer) override;
  void PreBackward(bool should_accumulate) override;
  void BackwardReturned() override { landing_scope_.reset(); }
  absl::Status PostBackward(bool should_accumulate) override;
  void FenceCommunication() override {
    if (sync_ != nullptr) sync_->WaitForInFlight();
  }
  // Logs how much of the gradient communication backward hid, then leaves the group.
  absl::Status Teardown() override;

  absl::Duration gradient_wait() const override {
    return sync_ != nullptr ? sync_->exposed_wait() : absl::ZeroDuration();
  }
  absl::Duration averaging_in_step() const override { return averaging_in_step_; }

  // With split_ the step averages the gradients as it updates the parameters.
  absl::Status OptimizerStep() override;
  absl::StatusOr<torch::optim::Optimizer*> OptimizerState() override;
  torch::optim::Optimizer* RestoreTarget() override;
  absl::Status FinishRestore(bool optimizer_restored) override;
  // Whether this job's optimizer step is split between the ranks (SplitOptimizerStep).
  bool splits_optimizer_step() const override { return split_ != nullptr; }
  bool mean_only_in_own_part_between_steps() const override {
    return split_ != nullptr && !gradients_read_between_steps_;
  }

 protected:
  // Makes every rank's parameters and buffers rank 0's.
  absl::Status SyncModel(LightningModule* model);

  std::unique_ptr<GradientSync> sync_;  // null in a group of one

 private:
  // Splits the optimizer step when every rank can (the ranks decide together).
  absl::Status MaybeSplitOptimizerStep(LightningModule* model);

  std::unique_ptr<SplitOptimizerStep> split_;
  bool averaging_due_ = false;  // split_: a backward ended a window; the step averages
  // split_: LightningModule::ReadsGradients, or options' gradients_read_between_steps.
  bool gradients_read_between_steps_ = true;
  bool consolidated_ = false;  // split_: optimizer_ holds a checkpoint's gathered state
  // split_, during a restore: optimizer_'s state before it, put back if the checkpoint held none.
  std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>
      state_before_restore_;
  absl::Duration averaging_in_step_;
  // split_, around backward: its new gradients may be made in their landing places.
  std::optional<GradientLanding::Scope> landing_scope_;
};

class ShardedStrategy : public DdpStrategy {
 public:
  using DdpStrategy::DdpStrategy;

  std::string name() const override { return "sharded"; }
  absl::Status Setup(LightningModule* model, const OptimizerConfig& optimizer) override;
  absl::Status OptimizerStep() override;
  void SetLearningRate(double lr) override;
  void SetGroupRates(const std::vector<GroupRates>& rates) override;
  absl::StatusOr<torch::optim::Optimizer*> OptimizerState() override;
  torch::optim::Optimizer* RestoreTarget() override;
  absl::Status FinishRestore(bool optimizer_restored) override;

  const ShardedOptimizer& sharded_optimizer() const { return *zero_; }

 private:
  std::unique_ptr<ShardedOptimizer> zero_;
  std::unique_ptr<torch::optim::Optimizer> consolidated_;    // rank 0, after OptimizerState
  std::unique_ptr<torch::optim::Optimizer> restore_target_;  // during a restore
};

}  // namespace dtrain

#include "worker/strategies/ddp_strategy.h"

#include <algorithm>
#include <set>
#include <typeinfo>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/torch_status.h"

namespace dtrain {

absl::Status DdpStrategy::SyncModel(LightningModule* model) {
  // A group of one has nothing to average or to broadcast: no hooks, no communication thread,
  // no pass over the gradients each step (without them the MLP's one-rank ddp job ran 1.04x).
  if (backend_->world_size() == 1) return absl::OkStatus();
  // Overlap hides a network's latency. Where the all-reduce is CPU work on the cores backward
  // runs on (shm), it only interleaves the two: on the CNN, a bucket started during backward
  // cost backward more than it saved the averaging (docs/decisions/planes.md). A CUDA model's
  // backward leaves the CPU free, so it keeps the overlap. The ranks decide together: with and
  // without overlap the buckets are cut differently, and their all-reduces must match.
  std::vector<torch::Tensor> parameters = model->Parameters();
  bool overlap = true;
  if (backend_->AllReduceComputesOnCaller()) {
    const bool on_cpu = std::all_of(parameters.begin(), parameters.end(),
                                    [](const torch::Tensor& p) { return p.device().is_cpu(); });
    DTRAIN_ASSIGN_OR_RETURN(const bool all_on_cpu,
                            backend_->ReduceBooleanDecision(on_cpu, /*all=*/true));
    overlap = !all_on_cpu;
  }
  sync_ = std::make_unique<GradientSync>(backend_.get(), std::move(parameters),
                                         options_.bucket_bytes, overlap);
  DTRAIN_RETURN_IF_ERROR(sync_->BroadcastParameters(0));
  std::vector<torch::Tensor> buffers;
  for (const auto& b : model->module().named_buffers()) buffers.push_back(b.value);
  return BroadcastTensors(backend_.get(), buffers, 0);
}

absl::Status DdpStrategy::Setup(LightningModule* model, const OptimizerConfig& optimizer) {
  DTRAIN_RETURN_IF_ERROR(Strategy::Setup(model, optimizer));
  DTRAIN_RETURN_IF_ERROR(SyncModel(model));
  return MaybeSplitOptimizerStep(model);
}

absl::Status DdpStrategy::MaybeSplitOptimizerStep(LightningModule* model) {
  // Only where the ranks share memory (the shm plane, which then does not overlap buckets with
  // backward): elsewhere every rank would still step every element. Every parameter must have
  // its gradient in a bucket, and nothing may read the gradients before the step.
  if (sync_ == nullptr || sync_->overlaps_backward() || !backend_->AllReduceComputesOnCaller()) {
    return absl::OkStatus();
  }
  // A plugin's subclass may read or step the gradients in overrides of its own, which would
  // then see this rank's unaveraged ones: only ddp itself splits.
  std::vector<torch::Tensor> parameters = model->Parameters();
  bool splits = typeid(*this) == typeid(DdpStrategy) && options_.split_optimizer_step &&
                !options_.gradients_read_before_step && optimizer_ != nullptr &&
                SplitOptimizerStep::Splits(*optimizer_);
  std::set<const void*> seen;
  for (const torch::Tensor& p : parameters) {
    // A tied parameter (listed twice) is stepped twice by the whole step, once by a split one.
    splits = splits && seen.insert(p.unsafeGetTensorImpl()).second && p.device().is_cpu() &&
             p.requires_grad() && p.is_contiguous() &&
             (p.scalar_type() == torch::kFloat32 || p.scalar_type() == torch::kFloat64);
  }
  DTRAIN_ASSIGN_OR_RETURN(const bool every_rank, backend_->ReduceBooleanDecision(splits, true));
  if (!every_rank) return absl::OkStatus();
  DTRAIN_ASSIGN_OR_RETURN(
      const bool placed,
      GuardTorch("cannot place the parameters beside their buckets",
                 [&]() -> absl::StatusOr<bool> { return sync_->PlaceParametersBesideBuckets(); }));
  if (!placed) {
    // On every rank alike (the plane allocates collectively): each would step every element.
    // The parameters stay in the plane's ordinary buffers, which is harmless.
    LogWarning("ddp: the optimizer step is not split: no shared memory for the parameters",
               {{"rank", static_cast<int64_t>(backend_->rank())}});
    return absl::OkStatus();
  }
  gradients_read_between_steps_ = options_.gradients_read_between_steps || model->ReadsGradients();
  split_ =
      std::make_unique<SplitOptimizerStep>(optimizer_.get(), sync_.get(), std::move(parameters));
  return absl::OkStatus();
}

void DdpStrategy::PreBackward(bool should_accumulate) {
  if (!should_accumulate && sync_ != nullptr) sync_->ExpectSync();
  // Every backward of a window (its gradients are averaged where they lie at its end).
  if (split_ != nullptr && sync_->landing() != nullptr) landing_scope_.emplace(sync_->landing());
}

absl::Status DdpStrategy::PostBackward(bool should_accumulate) {
  // While accumulating, gradients stay local (as under DDP's no_sync); the window's last
  // backward averages the sum of the window's gradients (a split step: as it steps).
  if (should_accumulate || sync_ == nullptr) return absl::OkStatus();
  if (split_ != nullptr) {
    averaging_due_ = true;
    return absl::OkStatus();
  }
  return sync_->AverageGradients();
}

absl::Status DdpStrategy::OptimizerStep() {
  const bool gradients_unread = std::exchange(gradients_unread_after_step_, false);
  if (split_ == nullptr) return Strategy::OptimizerStep();
  if (!averaging_due_) {
    return absl::InternalError(
        "a split optimizer step without a backward that ends its accumulation window");
  }
  averaging_due_ = false;
  // The averaged gradients on every rank only where something may read them after the step:
  // writing the peers' parts costs the MLP's step ~1% (docs/decisions/performance.md).
  const bool gradients_everywhere = !gradients_unread || gradients_read_between_steps_;
  const absl::Time start = absl::Now();
  const absl::Duration updating = sync_->update_time();
  // The plane owns the failure of an update (it fails the group); a libtorch error in the
  // packing of the gradients becomes a status here, as the unsplit averaging's does.
  absl::Status status = GuardTorch("averaging the gradients failed", [&] {
    return sync_->AverageGradientsAndUpdate(
        [this](size_t bucket, int64_t begin, int64_t end) {
          return split_->Update(bucket, begin, end);
        },
        gradients_everywhere);
  });
  // Gradients left averaged only in part must never be added to: spent now, not only at the
  // zero_grad that follows, which a failure between the two (a scheduler's) would skip.
  if (!gradients_everywhere) gradients_spent_ = true;
  averaging_in_step_ += (absl::Now() - start) - (sync_->update_time() - updating);
  // The state a checkpoint gathered is stale from this step on: the parts hold the live one. Only
  // now, after the step: parts made in it (after a restore) took their state from it.
  if (status.ok() && consolidated_) {
    optimizer_->state().clear();
    consolidated_ = false;
  }
  return status;
}

absl::StatusOr<torch::optim::Optimizer*> DdpStrategy::OptimizerState() {
  if (split_ != nullptr) {
    DTRAIN_RETURN_IF_ERROR(GuardTorch("cannot gather the optimizer state",
                                      [&] { return split_->Consolidate(backend_.get()); }));
    consolidated_ = true;
  }
  return Strategy::OptimizerState();
}

torch::optim::Optimizer* DdpStrategy::RestoreTarget() {
  // The state is kept aside (Adagrad's, made by its constructor, or a gathered one that parts
  // not yet made must read) for a checkpoint that holds none.
  if (split_ != nullptr) {
    state_before_restore_ = std::move(optimizer_->state());
    optimizer_->state().clear();
  }
  return Strategy::RestoreTarget();
}

absl::Status DdpStrategy::FinishRestore(bool optimizer_restored) {
  if (split_ != nullptr) {
    if (optimizer_restored) {
      // The parts start over from what the file held, even an empty state (saved before the
      // first step): the unsplit step starts fresh from it too.
      split_->Reset();
      consolidated_ = false;
    } else {
      // The checkpoint held none: the parts keep their live state, as the unsplit step keeps
      // its own, and the optimizer what it had.
      optimizer_->state() = std::move(state_before_restore_);
    }
    state_before_restore_.clear();
  }
  return Strategy::FinishRestore(optimizer_restored);
}

absl::Status DdpStrategy::Teardown() {
  if (sync_ != nullptr && sync_->rounds() > 0) {
    const int64_t rounds = sync_->rounds();
    const double exposed_ms = absl::ToDoubleMilliseconds(sync_->exposed_wait());
    LogInfo(
        absl::StrCat("rank ", backend_->rank(), " gradient sync: ", rounds, " rounds x ",
                     sync_->bucket_count(), " buckets"),
        {{"rank", backend_->rank()},
         {"strategy", name()},
         {"backend", backend_->name()},
         {"rounds", rounds},
         {"buckets", static_cast<int64_t>(sync_->bucket_count())},
         {"buckets_start", sync_->overlaps_backward() ? "during backward" : "after backward"},
         {"optimizer_step_split", split_ != nullptr ? "between the ranks" : "no"},
         // Rounds x buckets whose gradients backward made in plane memory (not copied in).
         {"buckets_landed_pct",
          100.0 * sync_->landed_total() / (rounds * static_cast<double>(sync_->bucket_count()))},
         {"started_during_backward_pct", 100.0 * sync_->buckets_started_during_backward_total() /
                                             (rounds * static_cast<double>(sync_->bucket_count()))},
         {"exposed_wait_ms", exposed_ms},
         {"exposed_wait_ms_per_round", exposed_ms / rounds}});
  }
  return Strategy::Teardown();
}

absl::Status ShardedStrategy::Setup(LightningModule* model, const OptimizerConfig& optimizer) {
  SetModel(model);
  optimizer_config_ = optimizer;
  lr_ = optimizer.lr;
  DTRAIN_RETURN_IF_ERROR(SyncModel(model));
  DTRAIN_ASSIGN_OR_RETURN(zero_,
                          ShardedOptimizer::Make(backend_.get(), model->Parameters(), optimizer));
  return absl::OkStatus();
}

absl::Status ShardedStrategy::OptimizerStep() {
  return GuardTorch("sharded optimizer step failed", [&] { return zero_->Step(); });
}

void ShardedStrategy::SetLearningRate(double lr) {
  lr_ = lr;
  zero_->SetLearningRate(lr);
}

void ShardedStrategy::SetGroupRates(const std::vector<GroupRates>& rates) {
  if (!rates.empty()) lr_ = rates.front().lr;
  zero_->SetGroupRates(rates);
}

absl::StatusOr<torch::optim::Optimizer*> ShardedStrategy::OptimizerState() {
  DTRAIN_ASSIGN_OR_RETURN(consolidated_, zero_->Consolidate(/*dst=*/0));
  return consolidated_.get();
}

torch::optim::Optimizer* ShardedStrategy::RestoreTarget() {
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> full =
      MakeOptimizer(model().Parameters(), optimizer_config_);
  restore_target_ = full.ok() ? std::move(*full) : nullptr;
  return restore_target_.get();
}

absl::Status ShardedStrategy::FinishRestore(bool optimizer_restored) {
  if (restore_target_ == nullptr) return absl::OkStatus();
  if (!optimizer_restored) {
    // Weights only: the partition keeps its state, as ddp's and single_device's optimizers do.
    restore_target_.reset();
    return absl::OkStatus();
  }
  absl::Status status = zero_->AdoptState(*restore_target_);
  restore_target_.reset();
  return status;
}

}  // namespace dtrain

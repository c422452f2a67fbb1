// Strategies (Lightning's training-type plugins): how a model is trained across processes and
// devices. One interface, built by MakeStrategy from its Lightning name:
//   single_device  one process, one device
//   ddp            one rank per process; parameters and buffers broadcast from rank 0 at
//                  setup; gradients averaged in buckets after backward, not while accumulating
//   ddp_spawn      ddp, with one child process per local device spawned by the worker daemon
//                  (worker/spawned_job.h); each child runs this ddp strategy
//   sharded        ddp plus ZeRO stage 1 (worker/sharded_optimizer.h)
//   dp             one process; the batch split across the worker's devices, outputs gathered,
//                  *_step_end reduces them as a mean (worker/data_parallel_strategy.h)
//   tpu_spawn      refused: there is no XLA runtime for C++ here
// The collectives under ddp, ddp_spawn and sharded go through a CollectiveBackend.
//
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective_backend.h"
#include "worker/lightning_module.h"
#include "worker/optimizers.h"
#include "worker/step_kind.h"

namespace dtrain {

enum class StrategyKind { kSingleDevice, kDdp, kDdpSpawn, kSharded, kDp };

// Lightning's names (and "ddp_sharded" for sharded); INVALID_ARGUMENT lists them otherwise,
// FAILED_PRECONDITION for tpu_spawn naming what is missing.
absl::StatusOr<StrategyKind> ParseStrategy(const std::string& name);
std::string StrategyName(StrategyKind kind);
// Whether the strategy runs collectives across processes (needs a group).
bool IsDistributed(StrategyKind kind);

struct StrategyOptions {
  StrategyKind kind = StrategyKind::kSingleDevice;
  torch::Device device = torch::kCPU;
  int devices = 1;  // dp: replicas
  // dp: each replica's device (PlanDevices: cuda:i, or the CPU for every replica); empty: the
  // root device for all.
  std::vector<torch::Device> replica_devices;
  int64_t bucket_bytes = int64_t{25} << 20;
};

// What the optimizer sees during a checkpoint restore, and how it is handed back.
class Strategy {
 public:
  // `backend` is the job's group (distributed strategies) or a LocalCollectiveBackend.
  static absl::StatusOr<std::unique_ptr<Strategy>> Make(const StrategyOptions& options,
                                                        std::unique_ptr<CollectiveBackend> backend);
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // connect(model) + setup_optimizers: keeps the model, makes the optimizer, and (ddp,
  // sharded) makes every rank's parameters and buffers equal to rank 0's.
  virtual absl::Status Setup(LightningModule* model, const OptimizerConfig& optimizer);

  CollectiveBackend& backend() { return *backend_; }
  int global_rank() const { return backend_->rank(); }
  int world_size() const { return backend_->world_size(); }
  int local_rank() const { return backend_->local_rank(); }
  int node_rank() const { return backend_->node_rank(); }
  bool is_global_zero() const { return global_rank() == 0; }
  torch::Device root_device() const { return options_.device; }
  // Only global rank 0 writes checkpoints (every rank holds the same model).
  bool should_rank_save_checkpoint() const { return is_global_zero(); }

  // The step methods run the model's; dp scatters the batch across replicas first.
  virtual absl::StatusOr<torch::Tensor> TrainingStep(const c10::IValue& batch, int64_t idx);
  virtual absl::StatusOr<StepOutput> EvalStep(StepKind kind, const c10::IValue& batch, int64_t idx);
  // *_step_end: reduce what the replicas returned (dp: a mean); the identity otherwise.
  virtual torch::Tensor TrainingStepEnd(torch::Tensor output) { return output; }
  virtual StepOutput EvalStepEnd(StepOutput output) { return output; }

  // Around loss.backward(): ddp averages gradients across ranks unless accumulating, starting
  // each bucket's all_reduce during backward as soon as its gradients are ready.
  virtual void PreBackward(bool should_accumulate) {}
  virtual absl::Status PostBackward(bool should_accumulate) { return absl::OkStatus(); }
  virtual absl::Status OptimizerStep();
  virtual void OptimizerZeroGrad();
  virtual void SetLearningRate(double lr);
  double learning_rate() const { return lr_; }

  // optimizer_state: an optimizer holding every parameter's state, valid on global rank 0.
  // A collective under sharded (the partitions are gathered); every rank must call it.
  virtual absl::StatusOr<torch::optim::Optimizer*> OptimizerState();
  // A checkpoint restores optimizer state into RestoreTarget(), then FinishRestore() hands it
  // to the strategy (sharded keeps only its partition). Loads from any world size.
  virtual torch::optim::Optimizer* RestoreTarget() { return optimizer_.get(); }
  virtual absl::Status FinishRestore() { return absl::OkStatus(); }

  // Collectives, as Lightning's strategy exposes them (identity in a world of one).
  absl::Status Barrier(const std::string& name) { return backend_->Barrier(name); }
  absl::Status Broadcast(torch::Tensor& tensor, int src) {
    return backend_->Broadcast(tensor, src);
  }
  // (world_size, *shape). With sync_grads, gradients flow back through the gather: the
  // gradient of this rank's input is the sum over ranks of the gradient of its slice.
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& tensor, bool sync_grads);
  // Lightning's strategy.reduce on one tensor: an all-reduce over the ranks (in place); dp's is
  // the tensor's mean.
  virtual absl::Status Reduce(torch::Tensor& tensor, v1::ReduceOp op) {
    return backend_->AllReduce(tensor, op);
  }
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all = true) {
    return backend_->ReduceBooleanDecision(decision, all);
  }

  // Waits until the collectives the strategy has in flight on other threads (ddp's gradient
  // buckets) are done, so that one issued now comes after them on every rank.
  virtual void FenceCommunication() {}

  // Leaves the group cleanly; the strategy is unusable afterwards.
  virtual absl::Status Teardown();

  // How long this rank has waited, in all, for gradients from the other ranks after its own
  // backward (the communication backward did not hide, plus the slower ranks' lead).
  virtual absl::Duration gradient_wait() const { return absl::ZeroDuration(); }

  LightningModule& model() { return *model_; }
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  const StrategyOptions& options() const { return options_; }

 protected:
  Strategy(StrategyOptions options, std::unique_ptr<CollectiveBackend> backend)
      : options_(std::move(options)), backend_(std::move(backend)) {}

  StrategyOptions options_;
  std::unique_ptr<CollectiveBackend> backend_;
  LightningModule* model_ = nullptr;
  OptimizerConfig optimizer_config_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  double lr_ = 0;
};

}  // namespace dtrain

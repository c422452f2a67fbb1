// Strategies (Lightning's training-type plugins): how a model is trained across processes and
// devices. One interface; dtrain's own register in the PluginRegistry under their Lightning
// names, beside any a --plugin library adds:
//   single_device  one process, one device
//   ddp            one rank per process; parameters and buffers broadcast from rank 0 at
//                  setup; gradients averaged in buckets after backward, not while accumulating
//   ddp_spawn      ddp, with one child process per local device spawned by the worker daemon
//                  (worker/runtime/spawned_job.h); each child runs this ddp strategy
//   sharded        ddp plus ZeRO stage 1 (worker/strategies/sharded_optimizer.h)
//   dp             one process; the batch split across the worker's devices, outputs gathered,
//                  *_step_end reduces them as a mean (worker/strategies/data_parallel_strategy.h)
//   tpu_spawn      refused: there is no XLA runtime for C++ here
// common/plugin_catalog.h names them and says what each is (its traits); this file attaches
// the factories.
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
#include "common/job_settings.h"
#include "worker/checkpoint/checkpoint_io.h"
#include "worker/collectives/collective_backend.h"
#include "worker/model/lightning_module.h"
#include "worker/model/optimizers.h"
#include "worker/model/step_kind.h"
#include "worker/plugins/plugin_registry.h"

namespace dtrain {

// A bucket cap in bytes, from the spec's MiB.
inline int64_t BucketBytes(double mebibytes) {
  return static_cast<int64_t>(mebibytes * (int64_t{1} << 20));
}

struct StrategyOptions {
  std::string name = "single_device";  // the registered name MakeStrategy builds
  StrategyTraits traits;               // the registry's, filled in by MakeStrategy
  torch::Device device = torch::kCPU;
  int devices = 1;  // dp: replicas
  // dp: each replica's device (PlanDevices: cuda:i, or the CPU for every replica); empty: the
  // root device for all.
  std::vector<torch::Device> replica_devices;
  // ddp, sharded: the gradient buckets' cap; the spec's trainer.bucket_cap_mb, whose default
  // this starts from.
  int64_t bucket_bytes = BucketBytes(JobSpecDefaults().trainer().bucket_cap_mb());
  // ddp: the spec's trainer.split_optimizer_step (SplitOptimizerStep), and whether the job reads
  // the gradients between backward and the optimizer step (clipping, a loss scaler), which the
  // split step cannot allow: it averages them only as it steps.
  bool split_optimizer_step = true;
  bool gradients_read_before_step = false;
  // Whether code the model's TorchScript does not show may read the gradients between a call's
  // steps (a plugin accelerator's or precision plugin's hooks): a split step then writes their
  // mean on every rank at every step, as for a model that reads .grad.
  bool gradients_read_between_steps = false;
};

// What the optimizer sees during a checkpoint restore, and how it is handed back.
// MakeStrategy (worker/runtime/registered_plugins.h) makes the registered one a job names.
class Strategy {
 public:
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
  // Lightning's strategy.checkpoint_io: what writes and reads checkpoints (default "torch").
  CheckpointIO& checkpoint_io() { return *checkpoint_io_; }
  void SetCheckpointIO(std::unique_ptr<CheckpointIO> io) { checkpoint_io_ = std::move(io); }

  // The step methods run the model's; dp scatters the batch across replicas first.
  virtual absl::StatusOr<torch::Tensor> TrainingStep(const c10::IValue& batch, int64_t idx);
  virtual absl::StatusOr<StepOutput> EvalStep(StepKind kind, const c10::IValue& batch, int64_t idx);
  // *_step_end: reduce what the replicas returned (dp: a mean); the identity otherwise.
  virtual torch::Tensor TrainingStepEnd(torch::Tensor output) { return output; }
  virtual StepOutput EvalStepEnd(StepOutput output) { return output; }

  // Around loss.backward(): ddp averages gradients across ranks unless accumulating, starting
  // each bucket's all_reduce during backward as soon as its gradients are ready.
  virtual void PreBackward(bool should_accumulate) {}
  // Right after loss.backward() returns or throws, on its thread, before anything else runs.
  virtual void BackwardReturned() {}
  virtual absl::Status PostBackward(bool should_accumulate) { return absl::OkStatus(); }
  virtual absl::Status OptimizerStep();
  // Lightning's zero_grad(set_to_none=True), at Lightning's moment: its closure zeroes after
  // training_step, right before backward, and only at an accumulation window's first batch. So
  // this only marks the gradients spent; they stay readable (a checkpoint, a hook) until
  // ReleaseSpentGradients drops them before the next backward. Autograd then hands each
  // parameter its new gradient instead of adding it to zeros: a memset and an add over every
  // gradient fewer a step (the plain loop's MLP step ~4.5% faster for it).
  virtual void OptimizerZeroGrad() { gradients_spent_ = true; }
  // For the next optimizer step: whether no code but the step's reads the gradients after it
  // before the next backward replaces them (the step is not a call's last, and no hook runs
  // in between), so that a strategy may leave them averaged only where it needs them. The
  // trainer sets it before every step (a value a failed step left is not inherited); the
  // step clears it. The model's own code reading .grad (LightningModule::ReadsGradients), or a
  // plugin's that might (StrategyOptions::gradients_read_between_steps), overrides it.
  void SetGradientsUnreadAfterNextStep(bool unread) { gradients_unread_after_step_ = unread; }
  // Around loss.backward() (the accelerator calls them, both before PostBackward): drops the
  // spent gradients, returning the parameters that held them; then gives zeros to those of them
  // the backward did not reach, so that the optimizer steps every parameter that had a gradient,
  // as when gradients were zeroed in place (momentum and weight decay included), and a strategy
  // averaging gradients sees every one of them.
  std::vector<torch::Tensor> ReleaseSpentGradients();
  static void ZeroMissingGradients(const std::vector<torch::Tensor>& released);
  virtual void SetLearningRate(double lr);
  // Per param group: the learning rate and momentum configure_optimizers' schedulers set.
  virtual void SetGroupRates(const std::vector<GroupRates>& rates);
  double learning_rate() const { return lr_; }

  // optimizer_state: an optimizer holding every parameter's state, valid on global rank 0.
  // A collective under sharded and a split ddp step (the partitions are gathered); every rank
  // must call it.
  virtual absl::StatusOr<torch::optim::Optimizer*> OptimizerState();
  // A checkpoint restores optimizer state into RestoreTarget(), then FinishRestore() hands it
  // to the strategy (sharded keeps only its partition); `optimizer_restored` is false when the
  // file held no optimizer state_dict (weights only). Loads from any world size.
  virtual torch::optim::Optimizer* RestoreTarget() { return optimizer_.get(); }
  virtual absl::Status FinishRestore(bool optimizer_restored) { return absl::OkStatus(); }

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

  // Lightning's hooks, called by the job at Lightning's moments (worker/runtime/job.cc); a plugin
  // strategy overrides the ones it needs. A failure fails the step (or setup) it belongs to.
  //   pre_dispatch   after setup (model on its device, optimizer made, ranks in sync)
  //   dispatch       when the run's first step arrives
  //   post_dispatch  at teardown, before the group is left
  virtual absl::Status PreDispatch() { return absl::OkStatus(); }
  virtual absl::Status Dispatch() { return absl::OkStatus(); }
  virtual absl::Status PostDispatch() { return absl::OkStatus(); }
  virtual absl::Status OnTrainStart() { return absl::OkStatus(); }
  virtual absl::Status OnTrainEnd() { return absl::OkStatus(); }
  virtual absl::Status OnValidationStart() { return absl::OkStatus(); }
  virtual absl::Status OnValidationEnd() { return absl::OkStatus(); }
  virtual absl::Status OnTestStart() { return absl::OkStatus(); }
  virtual absl::Status OnTestEnd() { return absl::OkStatus(); }
  virtual absl::Status OnPredictStart() { return absl::OkStatus(); }
  virtual absl::Status OnPredictEnd() { return absl::OkStatus(); }
  // Before each training batch's training_step.
  virtual absl::Status OnTrainBatchStart(int64_t batch_idx) { return absl::OkStatus(); }
  // After each optimizer step (not after a step 16-mixed skipped on inf/nan).
  virtual absl::Status PostOptimizerStep() { return absl::OkStatus(); }

  // Waits until the collectives the strategy has in flight on other threads (ddp's gradient
  // buckets) are done, so that one issued now comes after them on every rank.
  virtual void FenceCommunication() {}

  // Lightning's teardown barrier, so that no rank leaves while another still works in the group.
  // The job runs it when every rank is torn down at once; skipped when the group already lost a
  // member (it would wait for nobody). A failure is logged, not returned: leaving matters more.
  void TeardownBarrier();
  // Leaves the group cleanly; the strategy is unusable afterwards.
  virtual absl::Status Teardown();

  // How long this rank has waited, in all, for gradients from the other ranks after its own
  // backward (the communication backward did not hide, plus the slower ranks' lead).
  virtual absl::Duration gradient_wait() const { return absl::ZeroDuration(); }
  // Of the time in OptimizerStep, in all, the gradients' averaging (a split step averages as it
  // steps); zero for a strategy that averages after backward.
  virtual absl::Duration averaging_in_step() const { return absl::ZeroDuration(); }
  // Whether each rank steps only its share of the parameters (ddp's SplitOptimizerStep).
  virtual bool splits_optimizer_step() const { return false; }
  // Whether a split step leaves the mean of a step that is not a call's last only in this
  // rank's own part of the gradients (SetGradientsUnreadAfterNextStep).
  virtual bool mean_only_in_own_part_between_steps() const { return false; }

  LightningModule& model() { return *model_; }
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  const StrategyOptions& options() const { return options_; }

 protected:
  Strategy(StrategyOptions options, std::unique_ptr<CollectiveBackend> backend)
      : options_(std::move(options)), backend_(std::move(backend)) {}

  // Every Setup's first step: the model and its parameter list. The only way to set the model,
  // so that the list cannot go stale behind a subclass's back.
  void SetModel(LightningModule* model) {
    model_ = model;
    parameters_ = model->Parameters();
  }

  StrategyOptions options_;
  std::unique_ptr<CollectiveBackend> backend_;
  OptimizerConfig optimizer_config_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  double lr_ = 0;
  bool gradients_spent_ = false;
  bool gradients_unread_after_step_ = false;  // SetGradientsUnreadAfterNextStep, until the step
  std::unique_ptr<CheckpointIO> checkpoint_io_ = std::make_unique<TorchCheckpointIO>();

 private:
  LightningModule* model_ = nullptr;
  // model_'s parameters, listed at Setup: walking a TorchScript module's slots costs
  // microseconds, and ReleaseSpentGradients runs every step. The list stays true: to(), set_()
  // and checkpoint restores change a parameter's data in place, keeping its TensorImpl (only a
  // dp replica's are replaced, and a replica is never a strategy's model).
  std::vector<torch::Tensor> parameters_;
};

// dtrain's own strategies (the list above), added to `registry`.
void RegisterBuiltinStrategies(PluginRegistry& registry);

}  // namespace dtrain

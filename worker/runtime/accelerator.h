// The Accelerator, as in Lightning: one device plugin (CPUAccelerator, GPUAccelerator), one
// precision plugin and one strategy, and the per-step operations a training loop calls on
// them. Every method that touches libtorch returns a status; libtorch's exceptions never leave.
//
// Thread-safety: one thread at a time (a job's steps are sequential).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/lightning_module.h"
#include "worker/model/lr_schedulers.h"
#include "worker/model/optimizers.h"
#include "worker/plugins/plugin_registry.h"
#include "worker/precision/device_plan.h"
#include "worker/precision/precision.h"
#include "worker/runtime/gradient_clipping.h"
#include "worker/strategies/strategy.h"
#include "worker/strategies/strategy_collectives.h"

namespace dtrain {

// Subclassable by a plugin (worker/plugins/plugin_registry.h), as Lightning's Accelerator.
class Accelerator {
 public:
  // Builds the registered device plugin, then the precision plugin and the strategy on its root
  // device (all three from PluginRegistry::Global(), by the job spec's names), as PlanDevices
  // decides from this machine's device table.
  static absl::StatusOr<std::unique_ptr<Accelerator>> Make(
      const std::string& accelerator, const std::string& precision, StrategyOptions strategy,
      std::unique_ptr<CollectiveBackend> backend);
  static absl::StatusOr<std::unique_ptr<Accelerator>> Make(
      const std::string& accelerator, Precision precision, StrategyOptions strategy,
      std::unique_ptr<CollectiveBackend> backend);
  virtual ~Accelerator() = default;

  virtual std::string name() const = 0;
  torch::Device root_device() const { return device_; }
  Strategy& strategy() { return *strategy_; }
  PrecisionPlugin& precision() { return *precision_; }

  // setup(model): moves the model to the device, lets the precision plugin cast it, and lets the
  // strategy connect it and make its optimizer. `schedule` sets the learning rate per step.
  absl::Status Setup(LightningModule model, const OptimizerConfig& optimizer,
                     const SchedulerConfig& schedule);
  // configure_optimizers' schedulers (optimization.proto), made after Setup as the user's code
  // made them; they then set each param group's rates, in place of `schedule`. LambdaLR calls
  // the model's exported methods.
  absl::Status UseSchedulers(const google::protobuf::RepeatedPtrField<v1::SchedulerRecipe>& recipes,
                             const OptimizerConfig& optimizer);
  const LrSchedulers* schedulers() const { return schedulers_.get(); }
  // After a batch that closed an accumulation window (`batch_idx` from the epoch's start): the
  // schedulers whose interval it ends step, as Lightning's update_lr_schedulers.
  absl::Status AfterOptimizerWindow(int64_t batch_idx, bool closes_epoch);
  // After epoch `epoch`'s validation: ReduceLROnPlateau steps on its monitored value.
  absl::Status StepPlateaus(int64_t epoch, const std::map<std::string, double>& monitored);
  // LearningRateMonitor's values for the next optimizer step: "lr-<Optimizer>", with "/pg<i>"
  // per param group when there are several.
  std::vector<std::pair<std::string, double>> MonitoredRates() const;
  absl::Status ModelToDevice();
  // Moves every tensor of a nested batch to the root device and applies the precision's input
  // cast (64-true, bf16-true).
  c10::IValue BatchToDevice(const c10::IValue& batch) const;

  // The step methods run on the device under the precision plugin (autocast for -mixed).
  absl::StatusOr<torch::Tensor> TrainingStep(const c10::IValue& batch, int64_t batch_idx);
  torch::Tensor TrainingStepEnd(torch::Tensor output);
  absl::StatusOr<StepOutput> ValidationStep(const c10::IValue& batch, int64_t batch_idx);
  StepOutput ValidationStepEnd(StepOutput output);
  absl::StatusOr<StepOutput> TestStep(const c10::IValue& batch, int64_t batch_idx);
  StepOutput TestStepEnd(StepOutput output);
  absl::StatusOr<StepOutput> PredictStep(const c10::IValue& batch, int64_t batch_idx);

  // backward(closure_loss, optimizer, should_accumulate): scales the loss under 16-mixed,
  // runs autograd, and lets the strategy sync gradients unless accumulating.
  absl::Status Backward(const torch::Tensor& closure_loss, bool should_accumulate);
  // Of all Backward calls so far, the time in the strategy's averaging after autograd (a step
  // profile's "averaging" phase).
  absl::Duration averaging_time() const { return averaging_time_; }
  // Sets the scheduled learning rate and steps. Under 16-mixed, unscales first (unless
  // clipping already did), skips the step on inf/nan and updates the scale. Returns whether
  // the optimizer stepped.
  absl::StatusOr<bool> OptimizerStep();
  void OptimizerZeroGrad();
  // The run's optimizer steps, for a schedule that takes its length from the run (cosine
  // without total_steps); ignored by other schedules. FAILED_PRECONDITION from OptimizerStep
  // when such a schedule never got it.
  absl::Status SetRunLength(int64_t total_steps);
  // Unscales first under 16-mixed. Returns the gradients' total norm before clipping.
  absl::StatusOr<double> ClipGradients(double clip_val, ClipAlgorithm algorithm);

  // Lightning's accelerator hooks (see Strategy's): each runs the strategy's by default; a
  // plugin accelerator overrides the ones it needs and calls these for the strategy's part.
  virtual absl::Status PreDispatch() { return strategy_->PreDispatch(); }
  virtual absl::Status Dispatch() { return strategy_->Dispatch(); }
  virtual absl::Status PostDispatch() { return strategy_->PostDispatch(); }
  virtual absl::Status OnTrainStart() { return strategy_->OnTrainStart(); }
  virtual absl::Status OnTrainEnd() { return strategy_->OnTrainEnd(); }
  virtual absl::Status OnValidationStart() { return strategy_->OnValidationStart(); }
  virtual absl::Status OnValidationEnd() { return strategy_->OnValidationEnd(); }
  virtual absl::Status OnTestStart() { return strategy_->OnTestStart(); }
  virtual absl::Status OnTestEnd() { return strategy_->OnTestEnd(); }
  virtual absl::Status OnPredictStart() { return strategy_->OnPredictStart(); }
  virtual absl::Status OnPredictEnd() { return strategy_->OnPredictEnd(); }
  virtual absl::Status OnTrainBatchStart(int64_t batch_idx) {
    return strategy_->OnTrainBatchStart(batch_idx);
  }
  virtual absl::Status PostOptimizerStep() { return strategy_->PostOptimizerStep(); }

  // Calls the model's Lightning hook `name` (OK when it does not define it), with the job's
  // collectives in scope for torch.ops.dtrain.
  absl::Status CallHook(const std::string& name);
  // What model code logged (torch.ops.dtrain.log) since the last take.
  std::map<std::string, StrategyCollectives::Logged> TakeLogged() {
    return collectives_->TakeLogged();
  }

  // Collectives, through the strategy.
  absl::Status Barrier(const std::string& name) { return strategy_->Barrier(name); }
  absl::Status Broadcast(torch::Tensor& tensor, int src = 0) {
    return strategy_->Broadcast(tensor, src);
  }
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& tensor, bool sync_grads = false) {
    return strategy_->AllGather(tensor, sync_grads);
  }
  absl::Status Reduce(torch::Tensor& tensor, v1::ReduceOp op) {
    return strategy_->Reduce(tensor, op);
  }
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision) {
    return strategy_->ReduceBooleanDecision(decision);
  }

  // Parameters and buffers by name (detached; CPU tensors stay shared with the model).
  std::map<std::string, torch::Tensor> LightningModuleStateDict();
  // Every parameter's optimizer state, valid on global rank 0 (a collective under sharded).
  absl::StatusOr<torch::optim::Optimizer*> OptimizerState() { return strategy_->OptimizerState(); }
  // Every rank must call it; only the rank whose should_rank_save_checkpoint is true writes.
  // Returns whether this rank wrote.
  // `job_spec_json` (the resolved spec) goes into the checkpoint's metadata; the strategy's
  // CheckpointIO writes it with `storage_options`.
  // `callbacks`: the coordinator's callbacks' states, kept under the file's "callbacks".
  absl::StatusOr<bool> SaveCheckpoint(const std::string& path,
                                      const std::string& job_spec_json = "",
                                      const StorageOptions& storage_options = {},
                                      std::vector<CallbackStateDict> callbacks = {});
  // Every rank must call it: rank 0 reads the file and broadcasts its bytes (an error on rank 0
  // reaches every rank). Restores model, optimizer, loss scale, progress and RNG.
  absl::StatusOr<TrainingProgress> LoadCheckpoint(const std::string& path);

  // The strategy's teardown (a barrier, then leaving the group cleanly).
  virtual absl::Status Teardown();

  const TrainingProgress& progress() const { return progress_; }
  // After an optimizer step: the global step advances (Lightning's update_global_step).
  void UpdateGlobalStep() {
    ++progress_.global_step;
    model_->SetLoopState(progress_.epoch, progress_.global_step);
  }
  // model.train() / model.eval(): training steps run in train mode, validation, test and
  // predict in eval mode (Dropout off, BatchNorm on its running statistics), whatever mode the
  // module was exported in. Cheap when the mode does not change.
  void SetTrainingMode(bool on);
  void SetEpoch(int64_t epoch) {
    progress_.epoch = epoch;
    model_->SetLoopState(progress_.epoch, progress_.global_step);
  }
  LightningModule& model() { return *model_; }

 protected:
  explicit Accelerator(torch::Device device) : device_(device) {}

 private:
  absl::StatusOr<StepOutput> EvalStep(StepKind kind, const c10::IValue& batch, int64_t batch_idx);

  torch::Device device_;
  std::unique_ptr<PrecisionPlugin> precision_;
  std::unique_ptr<Strategy> strategy_;
  // torch.ops.dtrain's target while model code runs (after strategy_, which it uses).
  std::unique_ptr<StrategyCollectives> collectives_;
  std::unique_ptr<LightningModule> model_;
  std::optional<LrSchedule> schedule_;
  std::unique_ptr<LrSchedulers> schedulers_;
  // LearningRateMonitor's name, "lr-" and torch.optim's class name: built once, not per step.
  std::string lr_name_;
  TrainingProgress progress_;
  std::optional<bool> training_mode_;  // unset until the first step: the export's own mode
  // 16-mixed: whether this step's gradients are already unscaled, and what that found.
  bool unscaled_ = false;
  bool found_inf_ = false;
  absl::Duration averaging_time_;
};

class CPUAccelerator : public Accelerator {
 public:
  CPUAccelerator() : Accelerator(torch::kCPU) {}
  std::string name() const override { return "cpu"; }
};

// CUDA device `index`. Always compiled; Make refuses it where CUDA is missing.
class GPUAccelerator : public Accelerator {
 public:
  explicit GPUAccelerator(int index) : Accelerator(torch::Device(torch::kCUDA, index)) {}
  std::string name() const override { return "gpu"; }
};

// dtrain's own accelerators (cpu, gpu, cuda, auto), added to `registry`.
void RegisterBuiltinAccelerators(PluginRegistry& registry);

}  // namespace dtrain

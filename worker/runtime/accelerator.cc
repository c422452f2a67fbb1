#include "worker/runtime/accelerator.h"
#include "worker/runtime/compute_threads.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/types.h>
#include <chrono>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/batch_tree.h"
#include "worker/model/torch_status.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/registered_plugins.h"

namespace dtrain {

void SetComputeThreads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
}

absl::Status MoveComputeThreads(const std::vector<int>& cpus, const std::vector<int>& allowed,
                                int threads) {
  const std::vector<int>& target = cpus.empty() ? allowed : cpus;
  DTRAIN_RETURN_IF_ERROR(PinCurrentThread(target));
  // The team as it is now, one chunk per thread (grain 1): each pins itself.
  const int team = at::get_num_threads();
  if (team > 1) {
    std::vector<absl::Status> pinned(team);
    at::parallel_for(0, team, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) pinned[i] = PinCurrentThread(target);
    });
    for (const absl::Status& s : pinned) DTRAIN_RETURN_IF_ERROR(s);
  }
  SetComputeThreads(threads);
  return absl::OkStatus();
}

void RegisterBuiltinAccelerators(PluginRegistry& registry) {
  // One factory for the catalog's accelerators (common/plugin_catalog.h), each planned as its
  // own name: PlanDevices has already decided the device kind.
  const AcceleratorFactory builtin =
      [](const DevicePlan& plan) -> absl::StatusOr<std::unique_ptr<Accelerator>> {
    if (plan.kind == DeviceKind::kGpu) return std::make_unique<GPUAccelerator>(plan.root.index());
    return std::make_unique<CPUAccelerator>();
  };
  for (const PluginCatalogEntry& entry : PluginCatalog("accelerator")) {
    if (!entry.refusal.empty()) continue;
    absl::Status s = registry.AddAccelerator(entry.name, entry.name, builtin, entry.description);
    if (!s.ok()) {
      LogError(absl::StrCat("cannot register accelerator ", entry.name, ": ", s.ToString()));
    }
  }
}

absl::StatusOr<std::unique_ptr<Accelerator>> Accelerator::Make(
    const std::string& accelerator, Precision precision, StrategyOptions strategy,
    std::unique_ptr<CollectiveBackend> backend) {
  return Make(accelerator, PrecisionName(precision), std::move(strategy), std::move(backend));
}

absl::StatusOr<std::unique_ptr<Accelerator>> Accelerator::Make(
    const std::string& accelerator, const std::string& precision, StrategyOptions strategy,
    std::unique_ptr<CollectiveBackend> backend) {
  const PluginRegistry& registry = PluginRegistry::Global();
  DTRAIN_ASSIGN_OR_RETURN(PluginRegistry::AcceleratorEntry device,
                          registry.FindAccelerator(accelerator));
  DTRAIN_ASSIGN_OR_RETURN(PluginRegistry::PrecisionEntry precision_entry,
                          registry.FindPrecision(precision));
  DTRAIN_ASSIGN_OR_RETURN(PluginRegistry::StrategyEntry strategy_entry,
                          ResolveStrategy(strategy.name));
  DeviceRequest request;
  request.accelerator = device.planned_as;
  request.precision = precision_entry.planned_as;
  request.data_parallel = strategy_entry.traits.data_parallel;
  request.devices = strategy.devices;
  request.local_rank = backend == nullptr ? 0 : backend->local_rank();
  DTRAIN_ASSIGN_OR_RETURN(DevicePlan plan, PlanDevices(request, DeviceTable::Detect()));
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Accelerator> made, device.make(plan));
  DTRAIN_ASSIGN_OR_RETURN(made->precision_, precision_entry.make(plan.autocast));
  // A loss scaler unscales (and checks) the gradients before the step.
  if (made->precision_->scaler() != nullptr) strategy.gradients_read_before_step = true;
  // A plugin's hooks run between a call's steps (OnTrainBatchStart, PostOptimizerStep,
  // ConvertInput) and may read .grad, which no scan of the model can see. (Entries added to the
  // registry in-process, not by a --plugin library, count as dtrain's own.)
  if (device.info.origin != "builtin" || precision_entry.info.origin != "builtin") {
    strategy.gradients_read_between_steps = true;
  }
  strategy.device = made->device_;
  strategy.replica_devices = plan.replicas;
  DTRAIN_ASSIGN_OR_RETURN(made->strategy_, MakeStrategy(strategy, std::move(backend)));
  made->collectives_ = std::make_unique<StrategyCollectives>(made->strategy_.get());
  return made;
}

absl::Status Accelerator::Setup(LightningModule model, const OptimizerConfig& optimizer,
                                const SchedulerConfig& schedule) {
  model_ = std::make_unique<LightningModule>(std::move(model));
  DTRAIN_ASSIGN_OR_RETURN(LrSchedule made, LrSchedule::Make(schedule, optimizer.lr));
  schedule_ = made;
  lr_name_ = absl::StrCat("lr-", TorchOptimizerClass(optimizer.name));
  DTRAIN_RETURN_IF_ERROR(ModelToDevice());
  precision_->ConnectModule(*model_);
  return strategy_->Setup(model_.get(), optimizer);
}

absl::Status Accelerator::ModelToDevice() {
  return GuardTorch("cannot move the model to " + device_.str(), [&]() -> absl::Status {
    model_->module().to(device_);
    model_->SetDevice(device_);
    return absl::OkStatus();
  });
}

absl::Status Accelerator::UseSchedulers(
    const google::protobuf::RepeatedPtrField<v1::SchedulerRecipe>& recipes,
    const OptimizerConfig& optimizer) {
  LrLambda lambda = [this](const std::string& method, int64_t epoch) -> absl::StatusOr<double> {
    return GuardTorch(absl::StrCat("LambdaLR's ", method, "(", epoch, ") failed"),
                      [&]() -> absl::StatusOr<double> {
                        c10::IValue v = model_->module().run_method(method, epoch);
                        if (v.isDouble()) return v.toDouble();
                        if (v.isInt()) return static_cast<double>(v.toInt());
                        return absl::InvalidArgumentError(absl::StrCat(
                            "LambdaLR's ", method, " returned ", v.tagKind(), ", not a float"));
                      });
  };
  DTRAIN_ASSIGN_OR_RETURN(schedulers_, LrSchedulers::Make(recipes, optimizer, std::move(lambda)));
  strategy_->SetGroupRates(schedulers_->Rates());
  return absl::OkStatus();
}

absl::Status Accelerator::AfterOptimizerWindow(int64_t batch_idx, bool closes_epoch) {
  if (schedulers_ == nullptr) return absl::OkStatus();
  DTRAIN_RETURN_IF_ERROR(schedulers_->AfterOptimizerStep(batch_idx, closes_epoch, progress_.epoch));
  strategy_->SetGroupRates(schedulers_->Rates());
  return absl::OkStatus();
}

absl::Status Accelerator::StepPlateaus(int64_t epoch,
                                       const std::map<std::string, double>& monitored) {
  if (schedulers_ == nullptr) return absl::OkStatus();
  DTRAIN_RETURN_IF_ERROR(schedulers_->StepPlateaus(epoch, monitored));
  strategy_->SetGroupRates(schedulers_->Rates());
  return absl::OkStatus();
}

std::vector<std::pair<std::string, double>> Accelerator::MonitoredRates() const {
  const std::string& name = lr_name_;
  if (schedulers_ == nullptr) {
    // The spec's schedule sets the rate inside OptimizerStep: the one this step will use.
    const bool known = schedule_.has_value() && !schedule_->NeedsRunLength();
    return {{name, known ? schedule_->LrAt(progress_.global_step) : strategy_->learning_rate()}};
  }
  const ScheduledGroups& groups = schedulers_->groups();
  if (groups.size() == 1) return {{name, groups.front().lr}};
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < groups.size(); ++i) {
    out.emplace_back(absl::StrCat(name, "/pg", i + 1), groups[i].lr);
  }
  return out;
}

c10::IValue Accelerator::BatchToDevice(const c10::IValue& batch) const {
  return precision_->ConvertInput(MoveBatchToDevice(batch, device_));
}

absl::StatusOr<torch::Tensor> Accelerator::TrainingStep(const c10::IValue& batch,
                                                        int64_t batch_idx) {
  const c10::IValue on_device = BatchToDevice(batch);
  ScopedModelCollectives scope(collectives_.get());
  absl::StatusOr<torch::Tensor> loss =
      precision_->Run([&] { return strategy_->TrainingStep(on_device, batch_idx); });
  if (!loss.ok()) return collectives_->Explain(loss.status());
  return loss;
}

absl::Status Accelerator::CallHook(const std::string& name) {
  ScopedModelCollectives scope(collectives_.get());
  return collectives_->Explain(model_->CallHook(name));
}

torch::Tensor Accelerator::TrainingStepEnd(torch::Tensor output) {
  return strategy_->TrainingStepEnd(std::move(output));
}

absl::StatusOr<StepOutput> Accelerator::EvalStep(StepKind kind, const c10::IValue& batch,
                                                 int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  const c10::IValue on_device = BatchToDevice(batch);
  ScopedModelCollectives scope(collectives_.get());
  absl::StatusOr<StepOutput> out =
      precision_->Run([&] { return strategy_->EvalStep(kind, on_device, batch_idx); });
  if (!out.ok()) return collectives_->Explain(out.status());
  return out;
}

absl::StatusOr<StepOutput> Accelerator::ValidationStep(const c10::IValue& batch, int64_t i) {
  return EvalStep(StepKind::kValidation, batch, i);
}
absl::StatusOr<StepOutput> Accelerator::TestStep(const c10::IValue& batch, int64_t i) {
  return EvalStep(StepKind::kTest, batch, i);
}
absl::StatusOr<StepOutput> Accelerator::PredictStep(const c10::IValue& batch, int64_t i) {
  return EvalStep(StepKind::kPredict, batch, i);
}
StepOutput Accelerator::ValidationStepEnd(StepOutput output) {
  return strategy_->EvalStepEnd(std::move(output));
}
StepOutput Accelerator::TestStepEnd(StepOutput output) {
  return strategy_->EvalStepEnd(std::move(output));
}

absl::Status Accelerator::Backward(const torch::Tensor& closure_loss, bool should_accumulate) {
  ScopedModelCollectives scope(collectives_.get());
  DTRAIN_RETURN_IF_ERROR(collectives_->Explain(GuardTorch("backward failed", [&]() -> absl::Status {
    LossScaler* scaler = precision_->scaler();
    torch::Tensor loss = scaler != nullptr ? scaler->Scale(closure_loss) : closure_loss;
    const std::vector<torch::Tensor> released = strategy_->ReleaseSpentGradients();
    strategy_->PreBackward(should_accumulate);
    {
      absl::Cleanup returned = [&] { strategy_->BackwardReturned(); };
      loss.backward();
    }
    // Before PostBackward: a strategy that averages gradients sees every parameter that had
    // one with one, as when gradients were zeroed in place.
    Strategy::ZeroMissingGradients(released);
    return absl::OkStatus();
  })));
  // The averaging copies and reduces tensors: a libtorch error there is a status too.
  const auto averaging = std::chrono::steady_clock::now();
  absl::Status averaged = GuardTorch("averaging the gradients failed", [&]() -> absl::Status {
    return strategy_->PostBackward(should_accumulate);
  });
  averaging_time_ += absl::FromChrono(std::chrono::steady_clock::now() - averaging);
  return averaged;
}

absl::StatusOr<double> Accelerator::ClipGradients(double clip_val, ClipAlgorithm algorithm) {
  LossScaler* scaler = precision_->scaler();
  if (scaler != nullptr && !unscaled_) {
    DTRAIN_ASSIGN_OR_RETURN(found_inf_, GuardTorch("cannot unscale the gradients", [&] {
                              return scaler->Unscale(model_->Parameters());
                            }));
    unscaled_ = true;
  }
  return dtrain::ClipGradients(model_->Parameters(), clip_val, algorithm);
}

absl::StatusOr<bool> Accelerator::OptimizerStep() {
  LossScaler* scaler = precision_->scaler();
  bool skip = false;
  if (scaler != nullptr) {
    if (!unscaled_) {
      DTRAIN_ASSIGN_OR_RETURN(found_inf_, GuardTorch("cannot unscale the gradients", [&] {
                                return scaler->Unscale(model_->Parameters());
                              }));
    }
    skip = found_inf_;
    scaler->Update(found_inf_);
    unscaled_ = false;
    found_inf_ = false;
  }
  if (skip) return false;
  if (schedule_->NeedsRunLength()) {
    return absl::FailedPreconditionError(
        "the cosine schedule has no length: give lr_scheduler.total_steps, or send the run's "
        "length in StepRequest.total_steps");
  }
  if (schedulers_ == nullptr) strategy_->SetLearningRate(schedule_->LrAt(progress_.global_step));
  DTRAIN_RETURN_IF_ERROR(strategy_->OptimizerStep());
  return true;
}

absl::Status Accelerator::SetRunLength(int64_t total_steps) {
  if (!schedule_.has_value() || !schedule_->NeedsRunLength()) return absl::OkStatus();
  return schedule_->SetRunLength(total_steps);
}

void Accelerator::OptimizerZeroGrad() { strategy_->OptimizerZeroGrad(); }

std::map<std::string, torch::Tensor> Accelerator::LightningModuleStateDict() {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model_->module().named_parameters()) out[p.name] = p.value.detach();
  for (const auto& b : model_->module().named_buffers()) out[b.name] = b.value.detach();
  return out;
}

absl::StatusOr<bool> Accelerator::SaveCheckpoint(const std::string& path,
                                                 const std::string& job_spec_json,
                                                 const StorageOptions& storage_options,
                                                 std::vector<CallbackStateDict> callbacks) {
  DTRAIN_ASSIGN_OR_RETURN(torch::optim::Optimizer * optimizer, strategy_->OptimizerState());
  if (!strategy_->should_rank_save_checkpoint()) return false;
  CheckpointMetadata metadata;
  metadata.world_size = strategy_->world_size();
  metadata.strategy = strategy_->name();
  metadata.precision = PrecisionName(precision_->precision());
  metadata.job_spec_json = job_spec_json;
  if (schedule_.has_value()) metadata.schedule = &*schedule_;
  metadata.schedulers = schedulers_.get();
  metadata.callbacks = std::move(callbacks);
  DTRAIN_RETURN_IF_ERROR(dtrain::SaveCheckpoint(path, *model_, optimizer, precision_->scaler(),
                                                progress_, metadata, &strategy_->checkpoint_io(),
                                                storage_options));
  return true;
}

absl::StatusOr<TrainingProgress> Accelerator::LoadCheckpoint(const std::string& path) {
  // Rank 0 sends either "1" + the file's bytes or "0" + its error, so a missing or unreadable
  // file fails every rank with rank 0's message instead of leaving them waiting.
  std::string message;
  if (strategy_->is_global_zero()) {
    absl::StatusOr<std::string> bytes = strategy_->checkpoint_io().Load(path);
    message = bytes.ok() ? "1" + *bytes
                         : absl::StrCat("0", static_cast<int>(bytes.status().code()), ":",
                                        bytes.status().message());
  }
  DTRAIN_ASSIGN_OR_RETURN(std::string received, strategy_->backend().BroadcastBytes(message, 0));
  if (received.empty() || received[0] != '1') {
    const size_t colon = received.find(':');
    const int code = colon == std::string::npos ? 3 : std::atoi(received.c_str() + 1);
    return absl::Status(static_cast<absl::StatusCode>(code),
                        colon == std::string::npos ? "rank 0 could not read the checkpoint"
                                                   : received.substr(colon + 1));
  }
  received.erase(0, 1);
  absl::StatusOr<TrainingProgress> restored =
      RestoreCheckpoint(received, path, *model_, strategy_->RestoreTarget(), precision_->scaler());
  // A file refused restores nothing: the strategy takes back what RestoreTarget set aside.
  DTRAIN_RETURN_IF_ERROR(strategy_->FinishRestore(restored.ok() && restored->optimizer_restored));
  if (!restored.ok()) return restored.status();
  TrainingProgress progress = *std::move(restored);
  if (schedulers_ != nullptr && !progress.lr_schedulers.empty()) {
    DTRAIN_RETURN_IF_ERROR(schedulers_->Load(progress.lr_schedulers, progress.group_rates));
    strategy_->SetGroupRates(schedulers_->Rates());
  }
  progress.lr_schedulers.clear();
  progress_ = progress;
  model_->SetLoopState(progress_.epoch, progress_.global_step);
  return progress;
}

absl::Status Accelerator::Teardown() { return strategy_->Teardown(); }

void Accelerator::SetTrainingMode(bool on) {
  if (training_mode_ == on) return;
  model_->Train(on);
  training_mode_ = on;
}

}  // namespace dtrain

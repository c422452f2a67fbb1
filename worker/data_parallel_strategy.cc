#include "worker/data_parallel_strategy.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/batch_tree.h"
#include "worker/module_replica.h"
#include "worker/torch_status.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<Strategy>> DataParallelStrategy::Make(
    const StrategyOptions& options, std::unique_ptr<CollectiveBackend> backend) {
  if (options.devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp needs at least one device, got ", options.devices));
  }
  if (!options.replica_devices.empty() &&
      static_cast<int>(options.replica_devices.size()) != options.devices) {
    return absl::InternalError(absl::StrCat("dp: ", options.replica_devices.size(),
                                            " replica devices for ", options.devices, " replicas"));
  }
  return std::unique_ptr<Strategy>(new DataParallelStrategy(options, std::move(backend)));
}

bool DataParallelStrategy::replicated() const {
  for (const torch::Device& d : options_.replica_devices) {
    if (d != options_.device) return true;
  }
  return false;
}

absl::StatusOr<LightningModule*> DataParallelStrategy::Replica(int i) {
  if (i == 0 || !replicated()) return model_;
  if (replicas_.empty()) replicas_.resize(options_.devices);
  if (replicas_[i] == nullptr) {
    DTRAIN_ASSIGN_OR_RETURN(replicas_[i], ModuleReplica::Make(model_, options_.replica_devices[i]));
  }
  DTRAIN_RETURN_IF_ERROR(replicas_[i]->Bind());
  return &replicas_[i]->module();
}

c10::IValue DataParallelStrategy::ToReplica(const c10::IValue& part, int i) const {
  if (!replicated()) return part;
  const torch::Device device = options_.replica_devices[i];
  return MapTensors(part,
                    [&](const at::Tensor& t) { return t.device() == device ? t : t.to(device); });
}

absl::StatusOr<torch::Tensor> DataParallelStrategy::TrainingStep(const c10::IValue& batch,
                                                                 int64_t idx) {
  DTRAIN_ASSIGN_OR_RETURN(std::vector<c10::IValue> parts, SplitBatch(batch, options_.devices));
  std::vector<torch::Tensor> losses;
  for (int i = 0; i < static_cast<int>(parts.size()); ++i) {
    DTRAIN_ASSIGN_OR_RETURN(LightningModule * replica, Replica(i));
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor loss, replica->TrainingStep(ToReplica(parts[i], i), idx));
    if (replica != model_) model_->MergeTrainingExtras(*replica);
    // Gathered on the root device, where the optimizer's parameters are.
    losses.push_back(loss.reshape({}).to(options_.device));
  }
  return GuardTorch("dp gather",
                    [&]() -> absl::StatusOr<torch::Tensor> { return at::stack(losses); });
}

absl::StatusOr<StepOutput> DataParallelStrategy::EvalStep(StepKind kind, const c10::IValue& batch,
                                                          int64_t idx) {
  DTRAIN_ASSIGN_OR_RETURN(std::vector<c10::IValue> parts, SplitBatch(batch, options_.devices));
  std::map<std::string, std::vector<torch::Tensor>> gathered;
  for (int i = 0; i < static_cast<int>(parts.size()); ++i) {
    DTRAIN_ASSIGN_OR_RETURN(LightningModule * replica, Replica(i));
    const c10::IValue part = ToReplica(parts[i], i);
    absl::StatusOr<StepOutput> out =
        kind == StepKind::kValidation ? replica->ValidationStep(part, idx)
        : kind == StepKind::kTest     ? replica->TestStep(part, idx)
        : kind == StepKind::kPredict  ? replica->PredictStep(part, idx)
                                      : Strategy::EvalStep(kind, part, idx);
    if (!out.ok()) return out.status();
    for (auto& [key, value] : *out) gathered[key].push_back(value.to(options_.device));
  }
  per_replica_keys_.clear();
  StepOutput result;
  DTRAIN_RETURN_IF_ERROR(GuardTorch("dp gather", [&]() -> absl::Status {
    for (auto& [key, values] : gathered) {
      if (values.front().dim() == 0) {
        result[key] = at::stack(values);
        per_replica_keys_.insert(key);
      } else {
        result[key] = at::cat(values);
      }
    }
    return absl::OkStatus();
  }));
  return result;
}

torch::Tensor DataParallelStrategy::TrainingStepEnd(torch::Tensor output) {
  return output.dim() == 0 ? output : output.mean();
}

StepOutput DataParallelStrategy::EvalStepEnd(StepOutput output) {
  for (const std::string& key : per_replica_keys_) {
    auto it = output.find(key);
    if (it != output.end() && it->second.is_floating_point()) it->second = it->second.mean();
  }
  return output;
}

}  // namespace dtrain

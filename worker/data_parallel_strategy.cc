#include "worker/data_parallel_strategy.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/batch_tree.h"
#include "worker/torch_status.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<Strategy>> DataParallelStrategy::Make(
    const StrategyOptions& options, std::unique_ptr<CollectiveBackend> backend) {
  if (options.devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp needs at least one device, got ", options.devices));
  }
  return std::unique_ptr<Strategy>(new DataParallelStrategy(options, std::move(backend)));
}

absl::StatusOr<torch::Tensor> DataParallelStrategy::TrainingStep(const c10::IValue& batch,
                                                                 int64_t idx) {
  DTRAIN_ASSIGN_OR_RETURN(std::vector<c10::IValue> parts, SplitBatch(batch, options_.devices));
  std::vector<torch::Tensor> losses;
  for (const c10::IValue& part : parts) {
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor loss, model_->TrainingStep(part, idx));
    losses.push_back(loss.reshape({}));
  }
  return GuardTorch("dp gather",
                    [&]() -> absl::StatusOr<torch::Tensor> { return at::stack(losses); });
}

absl::StatusOr<StepOutput> DataParallelStrategy::EvalStep(StepKind kind, const c10::IValue& batch,
                                                          int64_t idx) {
  DTRAIN_ASSIGN_OR_RETURN(std::vector<c10::IValue> parts, SplitBatch(batch, options_.devices));
  std::map<std::string, std::vector<torch::Tensor>> gathered;
  for (const c10::IValue& part : parts) {
    DTRAIN_ASSIGN_OR_RETURN(StepOutput out, Strategy::EvalStep(kind, part, idx));
    for (auto& [key, value] : out) gathered[key].push_back(value);
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

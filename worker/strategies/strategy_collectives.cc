#include "worker/strategies/strategy_collectives.h"

#include <utility>

#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

v1::ReduceOp ToReduceOp(const std::string& op) {
  if (op == "mean") return v1::REDUCE_OP_MEAN;
  if (op == "max") return v1::REDUCE_OP_MAX;
  if (op == "min") return v1::REDUCE_OP_MIN;
  if (op == "product") return v1::REDUCE_OP_PRODUCT;
  return v1::REDUCE_OP_SUM;
}

std::string Shape(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

absl::Status StrategyCollectives::Record(absl::Status status) {
  if (!status.ok() && failure_.ok()) failure_ = status;
  return status;
}

absl::StatusOr<at::Tensor> StrategyCollectives::AllGather(const at::Tensor& tensor) {
  strategy_->FenceCommunication();
  absl::StatusOr<std::vector<torch::Tensor>> parts = strategy_->backend().AllGather(tensor);
  if (!parts.ok()) return Record(parts.status());
  for (size_t r = 0; r < parts->size(); ++r) {
    if (!(*parts)[r].sizes().equals(tensor.sizes())) {
      return Record(absl::InvalidArgumentError(
          absl::StrCat("all_gather needs the same shape on every rank: rank ", global_rank(),
                       " gave ", Shape(tensor), ", rank ", r, " gave ", Shape((*parts)[r]))));
    }
  }
  return GuardTorch("all_gather",
                    [&]() -> absl::StatusOr<at::Tensor> { return torch::stack(*parts); });
}

absl::Status StrategyCollectives::AllReduce(at::Tensor& tensor, const std::string& op) {
  strategy_->FenceCommunication();
  return Record(strategy_->backend().AllReduce(tensor, ToReduceOp(op)));
}

absl::Status StrategyCollectives::Broadcast(at::Tensor& tensor, int64_t src) {
  strategy_->FenceCommunication();
  return Record(strategy_->backend().Broadcast(tensor, static_cast<int>(src)));
}

absl::Status StrategyCollectives::Barrier(const std::string& name) {
  strategy_->FenceCommunication();
  return Record(strategy_->backend().Barrier(name.empty() ? "model" : "model:" + name));
}

absl::StatusOr<bool> StrategyCollectives::ReduceBooleanDecision(bool decision, bool all) {
  strategy_->FenceCommunication();
  absl::StatusOr<bool> reduced = strategy_->backend().ReduceBooleanDecision(decision, all);
  if (!reduced.ok()) return Record(reduced.status());
  return reduced;
}

absl::Status StrategyCollectives::Log(const std::string& name, const at::Tensor& value,
                                      const LogCallOptions& options) {
  torch::Tensor v = value.detach().to(torch::kCPU, torch::kFloat64).reshape({1});
  const double local = v.item<double>();
  if (options.sync_dist && world_size() > 1) {
    DTRAIN_RETURN_IF_ERROR(AllReduce(v, options.reduce_fx));
  }
  logged_[name] = Logged{v.item<double>(), local, options};
  return absl::OkStatus();
}

std::map<std::string, StrategyCollectives::Logged> StrategyCollectives::TakeLogged() {
  std::map<std::string, Logged> taken;
  taken.swap(logged_);
  return taken;
}

absl::Status StrategyCollectives::Explain(absl::Status error) {
  if (failure_.ok() || error.ok()) return error;
  absl::Status failure = std::exchange(failure_, absl::OkStatus());
  return absl::Status(failure.code(), absl::StrCat(failure.message(),
                                                   " (raised in model code by torch.ops.dtrain)"));
}

}  // namespace dtrain

#include "worker/strategy.h"

#include <torch/autograd.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "common/job_settings.h"
#include "common/status_macros.h"
#include "worker/data_parallel_strategy.h"
#include "worker/ddp_strategy.h"
#include "worker/torch_status.h"

namespace dtrain {
namespace {

class SingleDeviceStrategy : public Strategy {
 public:
  using Strategy::Strategy;
  std::string name() const override { return "single_device"; }
};

// all_gather(sync_grads=True): the forward pass is the gather done beforehand; the backward
// all-reduces the incoming gradient (every rank's loss depends on every rank's slice) and
// keeps this rank's slice, as Lightning's AllGatherGrad does.
struct AllGatherGrad : public torch::autograd::Function<AllGatherGrad> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor gathered, int64_t strategy_address) {
    ctx->saved_data["strategy"] = strategy_address;
    return gathered.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* strategy = reinterpret_cast<Strategy*>(ctx->saved_data["strategy"].toInt());
    torch::Tensor grad = grads[0].contiguous().clone();
    // After ddp's buckets in flight, so that every rank issues the collectives in one order.
    strategy->FenceCommunication();
    absl::Status status = strategy->backend().AllReduce(grad, v1::REDUCE_OP_SUM);
    TORCH_CHECK(status.ok(), "all_gather(sync_grads) backward: ", status.ToString());
    return {grad[strategy->global_rank()], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

absl::StatusOr<StrategyKind> ParseStrategy(const std::string& name) {
  if (name.empty() || name == "single_device") return StrategyKind::kSingleDevice;
  if (name == "ddp") return StrategyKind::kDdp;
  if (name == "ddp_spawn") return StrategyKind::kDdpSpawn;
  if (name == "sharded" || name == "ddp_sharded") return StrategyKind::kSharded;
  if (name == "dp") return StrategyKind::kDp;
  if (name == "tpu_spawn" || name == "xla") {
    return absl::FailedPreconditionError(absl::StrCat(
        "strategy '", name,
        "' needs an XLA runtime (torch_xla / PJRT) and TPU devices; no XLA "
        "runtime exists for libtorch's C++ API on this machine. Use ddp or ddp_spawn"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown strategy '", name, "'; use single_device, ddp, ddp_spawn, dp or sharded"));
}

std::string StrategyName(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kSingleDevice:
      return "single_device";
    case StrategyKind::kDdp:
      return "ddp";
    case StrategyKind::kDdpSpawn:
      return "ddp_spawn";
    case StrategyKind::kSharded:
      return "sharded";
    case StrategyKind::kDp:
      return "dp";
  }
  return "unknown";
}

bool IsDistributed(StrategyKind kind) { return IsDistributedStrategy(StrategyName(kind)); }

absl::StatusOr<std::unique_ptr<Strategy>> Strategy::Make(
    const StrategyOptions& options, std::unique_ptr<CollectiveBackend> backend) {
  if (backend == nullptr) backend = std::make_unique<LocalCollectiveBackend>();
  if (!IsDistributed(options.kind) && backend->world_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "strategy ", StrategyName(options.kind), " runs in one process, but its group has ",
        backend->world_size(), " ranks; use ddp for several"));
  }
  switch (options.kind) {
    case StrategyKind::kSingleDevice:
      return std::unique_ptr<Strategy>(new SingleDeviceStrategy(options, std::move(backend)));
    case StrategyKind::kDdp:
    case StrategyKind::kDdpSpawn:
      return std::unique_ptr<Strategy>(new DdpStrategy(options, std::move(backend)));
    case StrategyKind::kSharded:
      return std::unique_ptr<Strategy>(new ShardedStrategy(options, std::move(backend)));
    case StrategyKind::kDp:
      return DataParallelStrategy::Make(options, std::move(backend));
  }
  return absl::InvalidArgumentError("unknown strategy");
}

absl::Status Strategy::Setup(LightningModule* model, const OptimizerConfig& optimizer) {
  model_ = model;
  optimizer_config_ = optimizer;
  lr_ = optimizer.lr;
  DTRAIN_ASSIGN_OR_RETURN(optimizer_, MakeOptimizer(model->Parameters(), optimizer));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> Strategy::TrainingStep(const c10::IValue& batch, int64_t idx) {
  return model_->TrainingStep(batch, idx);
}

absl::StatusOr<StepOutput> Strategy::EvalStep(StepKind kind, const c10::IValue& batch,
                                              int64_t idx) {
  switch (kind) {
    case StepKind::kValidation:
      return model_->ValidationStep(batch, idx);
    case StepKind::kTest:
      return model_->TestStep(batch, idx);
    case StepKind::kPredict:
      return model_->PredictStep(batch, idx);
    case StepKind::kTraining:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(StepMethodName(kind), " is not an evaluation step"));
}

absl::Status Strategy::OptimizerStep() {
  return GuardTorch("optimizer step failed", [&]() -> absl::Status {
    optimizer_->step();
    return absl::OkStatus();
  });
}

void Strategy::OptimizerZeroGrad() {
  // set_to_none would make DDP's missing-gradient handling allocate each step; zero in place.
  for (const torch::Tensor& p : model_->Parameters()) {
    if (p.grad().defined()) {
      torch::Tensor grad = p.grad();
      grad.detach_();
      grad.zero_();
    }
  }
}

void Strategy::SetLearningRate(double lr) {
  lr_ = lr;
  if (optimizer_ == nullptr) return;
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
}

absl::StatusOr<torch::optim::Optimizer*> Strategy::OptimizerState() { return optimizer_.get(); }

absl::StatusOr<torch::Tensor> Strategy::AllGather(const torch::Tensor& tensor, bool sync_grads) {
  FenceCommunication();
  DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> parts, backend_->AllGather(tensor.detach()));
  return GuardTorch("all_gather", [&]() -> absl::StatusOr<torch::Tensor> {
    torch::Tensor gathered = torch::stack(parts);
    if (!sync_grads || !tensor.requires_grad()) return gathered;
    return AllGatherGrad::apply(tensor, gathered, reinterpret_cast<int64_t>(this));
  });
}

absl::Status Strategy::Teardown() { return backend_->Leave(); }

}  // namespace dtrain

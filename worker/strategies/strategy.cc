#include "worker/strategies/strategy.h"

#include <torch/autograd.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/torch_status.h"
#include "worker/strategies/data_parallel_strategy.h"
#include "worker/strategies/ddp_strategy.h"

namespace dtrain {
namespace {

class SingleDeviceStrategy : public Strategy {
 public:
  SingleDeviceStrategy(StrategyOptions options, std::unique_ptr<CollectiveBackend> backend)
      : Strategy(std::move(options), std::move(backend)) {}
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

void RegisterBuiltinStrategies(PluginRegistry& registry) {
  auto add = [&](const char* name, StrategyTraits traits, StrategyFactory make,
                 const char* description) {
    absl::Status s = registry.AddStrategy(name, traits, std::move(make), description);
    if (!s.ok()) LogError(absl::StrCat("cannot register strategy ", name, ": ", s.ToString()));
  };
  auto ddp = [](const StrategyOptions& o,
                std::unique_ptr<CollectiveBackend> b) -> absl::StatusOr<std::unique_ptr<Strategy>> {
    return std::unique_ptr<Strategy>(new DdpStrategy(o, std::move(b)));
  };
  auto sharded =
      [](const StrategyOptions& o,
         std::unique_ptr<CollectiveBackend> b) -> absl::StatusOr<std::unique_ptr<Strategy>> {
    return std::unique_ptr<Strategy>(new ShardedStrategy(o, std::move(b)));
  };
  add(
      "single_device", {},
      [](const StrategyOptions& o,
         std::unique_ptr<CollectiveBackend> b) -> absl::StatusOr<std::unique_ptr<Strategy>> {
        return std::unique_ptr<Strategy>(new SingleDeviceStrategy(o, std::move(b)));
      },
      "one process, one device");
  add("ddp", {.distributed = true}, ddp,
      "one rank per process; gradients averaged in buckets during backward");
  add("ddp_spawn", {.distributed = true, .spawns_per_device = true}, ddp,
      "ddp with one child process per local device, spawned by the worker daemon");
  add("sharded", {.distributed = true}, sharded, "ddp plus ZeRO stage 1 (optimizer state sharded)");
  add("ddp_sharded", {.distributed = true}, sharded, "sharded, by Lightning's older name");
  add(
      "dp", {.data_parallel = true},
      [](const StrategyOptions& o, std::unique_ptr<CollectiveBackend> b) {
        return DataParallelStrategy::Make(o, std::move(b));
      },
      "one process; the batch split across replicas on the local devices");
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

void Strategy::TeardownBarrier() {
  if (backend_->world_size() <= 1 || !backend_->health().ok()) return;
  absl::Status barrier = backend_->Barrier("teardown");
  if (!barrier.ok()) {
    // Leaving still matters more: the others then see a departure, not a death.
    LogWarning(absl::StrCat("teardown barrier: ", barrier.message()),
               {{"rank", static_cast<int64_t>(global_rank())}});
  }
}

absl::Status Strategy::Teardown() { return backend_->Leave(); }

}  // namespace dtrain

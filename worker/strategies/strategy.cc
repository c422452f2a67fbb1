#include "worker/strategies/strategy.h"

#include <map>

#include <torch/autograd.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/plugin_catalog.h"
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
    // A copy, not a view: the view would keep every rank's gradient alive as this one's storage.
    return {grad[strategy->global_rank()].clone(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void RegisterBuiltinStrategies(PluginRegistry& registry) {
  auto ddp = [](const StrategyOptions& o,
                std::unique_ptr<CollectiveBackend> b) -> absl::StatusOr<std::unique_ptr<Strategy>> {
    return std::unique_ptr<Strategy>(new DdpStrategy(o, std::move(b)));
  };
  // The factories of the catalog's strategies (common/plugin_catalog.h), which names them and
  // says what each is; worker_accelerator_test checks that none lacks one.
  const std::map<std::string, StrategyFactory> factories = {
      {"single_device",
       [](const StrategyOptions& o,
          std::unique_ptr<CollectiveBackend> b) -> absl::StatusOr<std::unique_ptr<Strategy>> {
         return std::unique_ptr<Strategy>(new SingleDeviceStrategy(o, std::move(b)));
       }},
      {"ddp", ddp},
      {"ddp_spawn", ddp},  // each spawned child runs ddp (worker/runtime/spawned_job.h)
      {"sharded",
       [](const StrategyOptions& o,
          std::unique_ptr<CollectiveBackend> b) -> absl::StatusOr<std::unique_ptr<Strategy>> {
         return std::unique_ptr<Strategy>(new ShardedStrategy(o, std::move(b)));
       }},
      {"dp",
       [](const StrategyOptions& o, std::unique_ptr<CollectiveBackend> b) {
         return DataParallelStrategy::Make(o, std::move(b));
       }},
  };
  for (const PluginCatalogEntry& entry : PluginCatalog("strategy")) {
    if (!entry.refusal.empty()) continue;
    auto factory = factories.find(entry.name);
    absl::Status s =
        factory == factories.end()
            ? absl::InternalError("the catalog names it, but this build has no factory")
            : registry.AddStrategy(entry.name, entry.traits, factory->second, entry.description);
    if (!s.ok())
      LogError(absl::StrCat("cannot register strategy ", entry.name, ": ", s.ToString()));
  }
}

absl::Status Strategy::Setup(LightningModule* model, const OptimizerConfig& optimizer) {
  SetModel(model);
  optimizer_config_ = optimizer;
  lr_ = optimizer.lr;
  DTRAIN_ASSIGN_OR_RETURN(optimizer_, MakeOptimizer(model->NamedParameters(), optimizer));
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

std::vector<torch::Tensor> Strategy::ReleaseSpentGradients() {
  std::vector<torch::Tensor> released;
  if (!gradients_spent_ || model_ == nullptr) return released;
  gradients_spent_ = false;
  for (const torch::Tensor& p : parameters_) {
    if (!p.grad().defined()) continue;
    p.mutable_grad().reset();
    released.push_back(p);
  }
  return released;
}

void Strategy::ZeroMissingGradients(const std::vector<torch::Tensor>& released) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor p : released) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
}

void Strategy::SetLearningRate(double lr) {
  lr_ = lr;
  if (optimizer_ == nullptr) return;
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
}

void Strategy::SetGroupRates(const std::vector<GroupRates>& rates) {
  if (!rates.empty()) lr_ = rates.front().lr;
  if (optimizer_ != nullptr) WriteGroupRates(*optimizer_, rates);
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

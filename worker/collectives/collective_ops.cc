// torch.ops.dtrain.*: the registrations and kernels (see collective_ops.h).
#include "worker/collectives/collective_ops.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

thread_local ModelCollectives* current_target = nullptr;

// TorchScript turns the exception into the model's error; the worker keeps the status itself
// (StrategyCollectives::Explain, worker/strategies/strategy_collectives.h), so its code and named
// ranks survive.
[[noreturn]] void Raise(const char* op, const absl::Status& status) {
  TORCH_CHECK(false, "torch.ops.dtrain.", op, ": ", std::string(status.message()));
}

void Check(const char* op, const absl::Status& status) {
  if (!status.ok()) Raise(op, status);
}

// all_gather(sync_grads=True), as Lightning's AllGatherGrad: every rank's loss depends on every
// rank's slice, so the backward all-reduces (sums) the incoming gradient and keeps this rank's
// slice. The target is the one in scope at forward time: backward may run outside that scope.
struct AllGatherWithGradients : public torch::autograd::Function<AllGatherWithGradients> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t target_address) {
    auto* target = reinterpret_cast<ModelCollectives*>(target_address);
    ctx->saved_data["target"] = target_address;
    absl::StatusOr<at::Tensor> gathered = target->AllGather(input.detach());
    if (!gathered.ok()) Raise("all_gather", gathered.status());
    return *gathered;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* target = reinterpret_cast<ModelCollectives*>(ctx->saved_data["target"].toInt());
    at::Tensor grad = grads[0].contiguous().clone();
    Check("all_gather (backward of sync_grads)", target->AllReduce(grad, "sum"));
    // A copy, not a view: the view would keep every rank's gradient alive as this one's storage.
    return {grad[target->global_rank()].clone(), at::Tensor()};
  }
};

at::Tensor AllGather(const at::Tensor& tensor, bool sync_grads) {
  ModelCollectives* target = current_target;
  if (target == nullptr) return tensor.unsqueeze(0).clone();
  if (sync_grads && tensor.requires_grad()) {
    return AllGatherWithGradients::apply(tensor, reinterpret_cast<int64_t>(target));
  }
  absl::StatusOr<at::Tensor> gathered = target->AllGather(tensor.detach());
  if (!gathered.ok()) Raise("all_gather", gathered.status());
  return *gathered;
}

at::Tensor AllReduce(const at::Tensor& tensor, std::string op) {
  Check("all_reduce", ValidateReduceOp(op));
  at::Tensor out = tensor.detach().clone();
  if (ModelCollectives* target = current_target) Check("all_reduce", target->AllReduce(out, op));
  return out;
}

at::Tensor Broadcast(const at::Tensor& tensor, int64_t src) {
  ModelCollectives* target = current_target;
  const int64_t world = target == nullptr ? 1 : target->world_size();
  if (src < 0 || src >= world) {
    Raise("broadcast", absl::InvalidArgumentError(
                           absl::StrCat("src ", src, " is not a rank of this world of ", world)));
  }
  at::Tensor out = tensor.detach().clone();
  if (target != nullptr) Check("broadcast", target->Broadcast(out, src));
  return out;
}

void Barrier(std::string name) {
  if (ModelCollectives* target = current_target) Check("barrier", target->Barrier(name));
}

bool ReduceBooleanDecision(bool decision, bool all) {
  ModelCollectives* target = current_target;
  if (target == nullptr) return decision;
  absl::StatusOr<bool> reduced = target->ReduceBooleanDecision(decision, all);
  if (!reduced.ok()) Raise("reduce_boolean_decision", reduced.status());
  return *reduced;
}

void Log(std::string name, const at::Tensor& value, bool sync_dist, std::string reduce_fx,
         c10::optional<bool> on_step, c10::optional<bool> on_epoch,
         c10::optional<int64_t> batch_size, bool prog_bar) {
  if (name.empty()) Raise("log", absl::InvalidArgumentError("the name is empty"));
  if (value.numel() != 1) {
    Raise("log", absl::InvalidArgumentError(
                     absl::StrCat("'", name, "' must be one value (a scalar tensor), got ",
                                  value.numel(), " elements")));
  }
  if (reduce_fx != "mean" && reduce_fx != "sum" && reduce_fx != "max" && reduce_fx != "min") {
    Raise("log", absl::InvalidArgumentError(absl::StrCat("reduce_fx '", reduce_fx, "' for '", name,
                                                         "': use mean, sum, max or min")));
  }
  if (batch_size.has_value() && *batch_size <= 0) {
    Raise("log", absl::InvalidArgumentError(
                     absl::StrCat("batch_size for '", name, "' must be > 0, got ", *batch_size)));
  }
  if (on_step.has_value() && on_epoch.has_value() && !*on_step && !*on_epoch) {
    Raise("log", absl::InvalidArgumentError(
                     absl::StrCat("'", name,
                                  "' has on_step=False and on_epoch=False: it would never be "
                                  "logged; set one of them")));
  }
  if (ModelCollectives* target = current_target) {
    LogCallOptions options;
    options.sync_dist = sync_dist;
    options.reduce_fx = std::move(reduce_fx);
    if (on_step.has_value()) options.on_step = *on_step;
    if (on_epoch.has_value()) options.on_epoch = *on_epoch;
    if (batch_size.has_value()) options.batch_size = *batch_size;
    options.prog_bar = prog_bar;
    Check("log", target->Log(name, value.detach(), options));
  }
}

int64_t GlobalRank() { return current_target == nullptr ? 0 : current_target->global_rank(); }
int64_t WorldSize() { return current_target == nullptr ? 1 : current_target->world_size(); }

}  // namespace

ScopedModelCollectives::ScopedModelCollectives(ModelCollectives* target)
    : previous_(current_target) {
  current_target = target;
}

ScopedModelCollectives::~ScopedModelCollectives() { current_target = previous_; }

absl::Status ValidateReduceOp(const std::string& op) {
  if (op == "sum" || op == "mean" || op == "max" || op == "min" || op == "product") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op '", op, "': use sum, mean, max, min or product"));
}

TORCH_LIBRARY(dtrain, m) {
  // CONSERVATIVE: every call has side effects on the other ranks (see the header).
  const auto conservative = c10::AliasAnalysisKind::CONSERVATIVE;
  m.def(torch::schema("dtrain::all_gather(Tensor tensor, bool sync_grads=False) -> Tensor",
                      conservative),
        &AllGather);
  m.def(torch::schema("dtrain::all_reduce(Tensor tensor, str op=\"sum\") -> Tensor", conservative),
        &AllReduce);
  m.def(torch::schema("dtrain::broadcast(Tensor tensor, int src=0) -> Tensor", conservative),
        &Broadcast);
  m.def(torch::schema("dtrain::barrier(str name=\"\") -> ()", conservative), &Barrier);
  m.def(torch::schema("dtrain::reduce_boolean_decision(bool decision, bool all=True) -> bool",
                      conservative),
        &ReduceBooleanDecision);
  m.def(torch::schema("dtrain::log(str name, Tensor value, bool sync_dist=False, "
                      "str reduce_fx=\"mean\", bool? on_step=None, bool? on_epoch=None, "
                      "int? batch_size=None, bool prog_bar=False) -> ()",
                      conservative),
        &Log);
  m.def(torch::schema("dtrain::global_rank() -> int", conservative), &GlobalRank);
  m.def(torch::schema("dtrain::world_size() -> int", conservative), &WorldSize);
}

}  // namespace dtrain

#include "worker/strategies/module_replica.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

// Sets attribute `dotted` ("encoder.0.weight") of `root` to `value`.
void SetDotted(torch::jit::Module root, const std::string& dotted, const torch::Tensor& value) {
  std::vector<std::string> parts = absl::StrSplit(dotted, '.');
  torch::jit::Module owner = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) owner = owner.attr(parts[i]).toModule();
  owner.setattr(parts.back(), value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModuleReplica>> ModuleReplica::Make(LightningModule* source,
                                                                   torch::Device device) {
  return GuardTorch(absl::StrCat("cannot replicate the model on ", device.str()),
                    [&]() -> absl::StatusOr<std::unique_ptr<ModuleReplica>> {
                      torch::jit::Module copy = source->module().deepcopy();
                      copy.to(device);
                      absl::StatusOr<LightningModule> wrapped =
                          LightningModule::Wrap(std::move(copy), source->origin());
                      if (!wrapped.ok()) return wrapped.status();
                      auto replica = std::unique_ptr<ModuleReplica>(
                          new ModuleReplica(source, std::move(*wrapped), device));
                      replica->replica_.Train(source->module().is_training());
                      // self.device in the replica's code is the replica's device, not the
                      // source's the copy brought along.
                      replica->replica_.SetDevice(device);
                      return replica;
                    });
}

absl::Status ModuleReplica::Bind() {
  return GuardTorch(absl::StrCat("cannot copy the parameters to ", device_.str()),
                    [&]() -> absl::Status {
                      // copy=true: a differentiable copy even on the same device, so backward
                      // always reaches the source's parameters through it.
                      for (const auto& p : source_->module().named_parameters(true)) {
                        SetDotted(replica_.module(), p.name,
                                  p.value.to(device_, /*non_blocking=*/false, /*copy=*/true));
                      }
                      torch::NoGradGuard no_grad;
                      for (const auto& b : source_->module().named_buffers(true)) {
                        SetDotted(replica_.module(), b.name, b.value.to(device_));
                      }
                      replica_.Train(source_->module().is_training());
                      // The trainer sets self.current_epoch / self.global_step on the source.
                      replica_.CopyLoopStateFrom(*source_);
                      return absl::OkStatus();
                    });
}

}  // namespace dtrain

#include "worker/data/script_transform.h"

#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "worker/model/torch_status.h"

namespace dtrain {

struct ScriptTransform::Module {
  torch::jit::Module module;
};

ScriptTransform::ScriptTransform(std::unique_ptr<Module> module) : module_(std::move(module)) {}
ScriptTransform::~ScriptTransform() = default;

absl::StatusOr<std::shared_ptr<const ScriptTransform>> ScriptTransform::Load(
    const std::string& path, bool training) {
  absl::StatusOr<torch::jit::Module> loaded = GuardTorch(
      absl::StrCat("transforms.script: cannot load '", path, "' as a TorchScript module"),
      [&]() -> absl::StatusOr<torch::jit::Module> { return torch::jit::load(path, at::kCPU); });
  if (!loaded.ok()) return absl::InvalidArgumentError(loaded.status().message());
  if (!loaded->find_method("forward").has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transforms.script: '", path,
                     "' has no forward(self, fields: List[Tensor], seed: int) -> List[Tensor]"));
  }
  loaded->train(training);
  auto module = std::make_unique<Module>();
  module->module = std::move(*loaded);
  return std::shared_ptr<const ScriptTransform>(new ScriptTransform(std::move(module)));
}

absl::StatusOr<std::vector<at::Tensor>> ScriptTransform::Apply(std::vector<at::Tensor> fields,
                                                               uint64_t seed) const {
  return GuardTorch("transforms.script failed", [&]() -> absl::StatusOr<std::vector<at::Tensor>> {
    torch::NoGradGuard no_grad;
    // forward is const in effect; TorchScript's API takes the module by non-const reference.
    torch::jit::Module& m = const_cast<torch::jit::Module&>(module_->module);
    c10::IValue out = m.forward(
        {c10::List<at::Tensor>(fields), static_cast<int64_t>(seed & 0x7fffffffffffffffULL)});
    if (!out.isTensorList()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transforms.script returned a ", out.tagKind(), ", not a List[Tensor]"));
    }
    std::vector<at::Tensor> result = out.toTensorVector();
    for (at::Tensor& t : result) t = t.contiguous();
    return result;
  });
}

}  // namespace dtrain

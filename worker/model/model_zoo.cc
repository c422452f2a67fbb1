#include "worker/model/model_zoo.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_settings.h"

namespace dtrain {
namespace {

// Shared by both models: the steps differ only in forward.
constexpr char kSteps[] = R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    x, y = batch
    return torch.nll_loss(torch.log_softmax(self.forward(x), 1), y)

def validation_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    x, y = batch
    logits = self.forward(x)
    loss = torch.nll_loss(torch.log_softmax(logits, 1), y)
    acc = (logits.argmax(1) == y).float().mean()
    return {"loss": loss, "acc": acc}

def test_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    return self.validation_step(batch, batch_idx)

def predict_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    x, y = batch
    logits = self.forward(x)
    return {"logits": logits, "label": logits.argmax(1)}
)";

constexpr char kMlpForward[] = R"(
def forward(self, x: Tensor) -> Tensor:
    h = torch.relu(torch.linear(x.flatten(1), self.fc1_weight, self.fc1_bias))
    return torch.linear(h, self.fc2_weight, self.fc2_bias)
)";

constexpr char kCnnForward[] = R"(
def forward(self, x: Tensor) -> Tensor:
    x = x.reshape([-1, 1, 28, 28])
    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv1_weight, self.conv1_bias, [1, 1], [1, 1])), [2, 2])
    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv2_weight, self.conv2_bias, [1, 1], [1, 1])), [2, 2])
    h = torch.relu(torch.linear(x.flatten(1), self.fc1_weight, self.fc1_bias))
    return torch.linear(h, self.fc2_weight, self.fc2_bias)
)";

// As torch.nn.Linear / Conv2d's default init: weights and biases uniform in +-1/sqrt(fan_in).
void AddLayer(torch::jit::Module& m, const std::string& name, std::vector<int64_t> weight_shape,
              at::Generator& gen) {
  int64_t fan_in = 1;
  for (size_t i = 1; i < weight_shape.size(); ++i) fan_in *= weight_shape[i];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  torch::NoGradGuard no_grad;
  m.register_parameter(name + "_weight",
                       torch::empty(weight_shape).uniform_(-bound, bound, gen).requires_grad_(true),
                       false);
  m.register_parameter(
      name + "_bias",
      torch::empty({weight_shape[0]}).uniform_(-bound, bound, gen).requires_grad_(true), false);
}

}  // namespace

absl::StatusOr<LightningModule> BuiltinModel(const std::string& name, uint64_t seed) {
  // A generator of its own: the same seed gives the same model whichever thread builds it,
  // and torch's global generator is left alone.
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::jit::Module m(name);
  std::string source;
  if (name == "mlp") {
    AddLayer(m, "fc1", {256, 784}, gen);
    AddLayer(m, "fc2", {10, 256}, gen);
    source = kMlpForward;
  } else if (name == "cnn") {
    AddLayer(m, "conv1", {32, 1, 3, 3}, gen);
    AddLayer(m, "conv2", {64, 32, 3, 3}, gen);
    AddLayer(m, "fc1", {128, 64 * 7 * 7}, gen);
    AddLayer(m, "fc2", {10, 128}, gen);
    source = kCnnForward;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown builtin model '", name,
                     "'; the zoo has: ", absl::StrJoin(SettingNames("model.builtin"), ", ")));
  }
  try {
    m.define(source + kSteps);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("builtin model '", name, "' does not compile: ", e.what()));
  }
  return LightningModule::Wrap(std::move(m), "builtin:" + name);
}

}  // namespace dtrain

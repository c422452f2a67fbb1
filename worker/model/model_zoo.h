// The built-in model zoo: LightningModules written as TorchScript source and compiled in C++,
// so that no Python is needed. Both take 28x28 single-channel images ([N, 1, 28, 28] float32,
// or [N, 784]) and int64 labels in [0, 10):
//   "mlp": 784 -> 256 -> ReLU -> 10
//   "cnn": conv 3x3 (1 -> 32) -> ReLU -> max-pool 2 -> conv 3x3 (32 -> 64) -> ReLU -> max-pool 2
//          -> 3136 -> 128 -> ReLU -> 10
// Methods: forward(x) -> logits; training_step((x, y), i) -> cross-entropy loss;
// validation_step / test_step -> {"loss", "acc"}; predict_step -> {"logits", "label"}.
// Parameters are initialized as torch.nn.Linear / Conv2d do (uniform in +-1/sqrt(fan_in)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/lightning_module.h"

namespace dtrain {

// INVALID_ARGUMENT for an unknown name (the message lists the zoo: the names model.builtin's
// Setting option accepts, job_spec.proto).
absl::StatusOr<LightningModule> BuiltinModel(const std::string& name, uint64_t seed);

}  // namespace dtrain

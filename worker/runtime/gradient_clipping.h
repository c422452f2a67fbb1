// clip_gradients(clip_val, norm | value), as Lightning's Accelerator exposes it, on libtorch's
// own clip_grad_norm_ / clip_grad_value_. With 16-mixed, unscale (LossScaler::Unscale) first.
#pragma once

#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"

namespace dtrain {

enum class ClipAlgorithm { kNorm, kValue };

// "norm" | "value"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ClipAlgorithm> ParseClipAlgorithm(const std::string& name);

// Clips the gradients of `parameters` in place. Returns the total 2-norm of the gradients
// before clipping (for both algorithms, for logging). INVALID_ARGUMENT when clip_val <= 0.
absl::StatusOr<double> ClipGradients(const std::vector<torch::Tensor>& parameters, double clip_val,
                                     ClipAlgorithm algorithm);

}  // namespace dtrain

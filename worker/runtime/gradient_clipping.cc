#include "worker/runtime/gradient_clipping.h"

#include <cmath>

#include <torch/nn/utils/clip_grad.h>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::StatusOr<ClipAlgorithm> ParseClipAlgorithm(const std::string& name) {
  if (name == "norm") return ClipAlgorithm::kNorm;
  if (name == "value") return ClipAlgorithm::kValue;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown gradient_clip_algorithm '", name, "'; use norm or value"));
}

absl::StatusOr<double> ClipGradients(const std::vector<torch::Tensor>& parameters, double clip_val,
                                     ClipAlgorithm algorithm) {
  if (!(clip_val > 0) || !std::isfinite(clip_val)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_clip_val must be a positive number, got ", clip_val));
  }
  if (algorithm == ClipAlgorithm::kNorm) {
    return torch::nn::utils::clip_grad_norm_(parameters, clip_val);
  }
  double total = 0;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) total += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  torch::nn::utils::clip_grad_value_(parameters, clip_val);
  return std::sqrt(total);
}

}  // namespace dtrain

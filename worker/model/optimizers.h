// Optimizers (sgd with momentum / nesterov / weight_decay, adam, adamw: libtorch's own) and
// learning-rate schedules (step, cosine). The schedules are computed here, per optimizer step,
// as closed-form functions of the step: libtorch 1.13's C++ API has StepLR but no cosine
// schedule, and one formula per schedule is easier to check and to checkpoint (only the step
// number is state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"

namespace dtrain {

struct OptimizerConfig {
  std::string name = "sgd";  // sgd | adam | adamw
  double lr = 0.01;
  double momentum = 0.0;      // sgd
  bool nesterov = false;      // sgd; needs momentum > 0
  double weight_decay = 0.0;  // adamw: decoupled
  double beta1 = 0.9;         // adam, adamw
  double beta2 = 0.999;
  double eps = 1e-8;
};

// INVALID_ARGUMENT for an unknown name or an out-of-range value (the message names it).
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    std::vector<torch::Tensor> parameters, const OptimizerConfig& config);

struct SchedulerConfig {
  std::string name = "none";  // none | step | cosine
  int64_t step_size = 1;      // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  int64_t total_steps = 0;  // cosine: steps from base lr down to min_lr; 0: the run's length
  double min_lr = 0.0;
};

class LrSchedule {
 public:
  // INVALID_ARGUMENT for an unknown name or bad values.
  static absl::StatusOr<LrSchedule> Make(const SchedulerConfig& config, double base_lr);

  // The learning rate for optimizer step `step` (counting from 0).
  double LrAt(int64_t step) const;
  // Whether the schedule still needs the run's length (cosine without total_steps).
  bool NeedsRunLength() const { return config_.name == "cosine" && config_.total_steps < 1; }
  // The run's optimizer steps, for a schedule whose config left its length to the run.
  // INVALID_ARGUMENT when `total_steps` < 1.
  absl::Status SetRunLength(int64_t total_steps);
  // torch.optim.lr_scheduler's state_dict() for this schedule after `step` optimizer steps
  // (StepLR, CosineAnnealingLR; None for "none"), as a Lightning checkpoint's lr_schedulers
  // entry holds it.
  c10::IValue StateDict(int64_t step) const;
  // Sets every parameter group of `optimizer` to LrAt(step).
  void Apply(torch::optim::Optimizer& optimizer, int64_t step) const;

 private:
  LrSchedule(SchedulerConfig config, double base_lr)
      : config_(std::move(config)), base_lr_(base_lr) {}
  SchedulerConfig config_;
  double base_lr_;
};

}  // namespace dtrain

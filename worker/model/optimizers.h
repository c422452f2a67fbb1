// Optimizers (torch.optim's SGD, Adam, AdamW, RMSprop and Adagrad: libtorch's own, with
// param groups) and the spec's learning-rate schedules (step, cosine; configure_optimizers'
// schedulers are worker/model/lr_schedulers.h). The schedules are computed here, per optimizer
// step, as closed-form functions of the step: libtorch 1.13's C++ API has StepLR but no cosine
// schedule, and one formula per schedule is easier to check and to checkpoint (only the step
// number is state).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "common/job_settings.h"
#include "dtrain/v1/optimization.pb.h"

namespace dtrain {

struct ParamGroupConfig;

// The job spec's optimizer and lr_scheduler (job_spec.proto), or configure_optimizers' recipe
// (optimization.proto), as the worker uses them; the defaults are the spec's own (its Setting
// options) and torch's, for code that builds a config directly.
struct OptimizerConfig {
  std::string name = "sgd";  // sgd | adam | adamw | rmsprop | adagrad
  double lr = JobSpecDefaults().optimizer().lr();
  double momentum = JobSpecDefaults().optimizer().momentum();          // sgd, rmsprop
  bool nesterov = false;                                               // sgd; needs momentum > 0
  double weight_decay = JobSpecDefaults().optimizer().weight_decay();  // adamw: decoupled
  double beta1 = JobSpecDefaults().optimizer().beta1();                // adam, adamw
  double beta2 = JobSpecDefaults().optimizer().beta2();
  double eps = JobSpecDefaults().optimizer().eps();  // adam, adamw, rmsprop, adagrad
  double dampening = 0;                              // sgd
  bool amsgrad = false;                              // adam, adamw
  double alpha = 0.99;                               // rmsprop
  bool centered = false;                             // rmsprop
  double lr_decay = 0;                               // adagrad
  double initial_accumulator_value = 0;              // adagrad
  // configure_optimizers' param groups, each with its parameters' names and its own options
  // (the fields above; `groups` of an option set is unused). Empty: one group of every
  // parameter with the options above.
  std::vector<ParamGroupConfig> groups = {};
};

struct ParamGroupConfig {
  std::vector<std::string> params;
  OptimizerConfig options;
};

// torch.optim's class name for `name` ("adamw" -> "AdamW"), as LearningRateMonitor names it.
std::string TorchOptimizerClass(const std::string& name);

// Where a libtorch optimizer keeps `parameter`'s state (Optimizer::state()'s key).
std::string OptimizerStateKey(const torch::Tensor& parameter);

// configure_optimizers' optimizer as a config: INVALID_ARGUMENT for a kind dtrain lacks or a
// group without parameters.
absl::StatusOr<OptimizerConfig> OptimizerFromRecipe(const v1::OptimizerRecipe& recipe);

// INVALID_ARGUMENT for an unknown name or an out-of-range value (the message names it). With
// `config.groups`, only a single group can be applied to unnamed parameters.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    std::vector<torch::Tensor> parameters, const OptimizerConfig& config);
// The same with the parameters' names, which `config.groups` name (a name that is not a
// parameter, or one in two groups, is INVALID_ARGUMENT). Parameters in no group are not
// stepped, as in torch.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
    const OptimizerConfig& config);

// Per param group of an optimizer: its learning rate, and its momentum (sgd, rmsprop) or first
// beta (adam, adamw) when it has one; what the schedulers keep and write into it.
struct GroupRates {
  double lr = 0;
  std::optional<double> momentum;
};
void WriteGroupRates(torch::optim::Optimizer& optimizer, const std::vector<GroupRates>& rates);

struct SchedulerConfig {
  std::string name = JobSpecDefaults().lr_scheduler().name();  // none | step | cosine
  // step: multiply by gamma every step_size steps
  int64_t step_size = JobSpecDefaults().lr_scheduler().step_size();
  double gamma = JobSpecDefaults().lr_scheduler().gamma();
  // cosine: steps from base lr down to min_lr; 0: the run's length
  int64_t total_steps = JobSpecDefaults().lr_scheduler().total_steps();
  double min_lr = JobSpecDefaults().lr_scheduler().min_lr();
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

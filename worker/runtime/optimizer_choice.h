// Which optimizer a job trains with, and the line its log shows: the spec's, when it names one
// (as LightningCLI's optimizer section overrides configure_optimizers); else the model's
// recorded configure_optimizers (optimization.proto's recipe, JSON in the model file); else
// SGD at the spec's default lr.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/optimization.pb.h"
#include "worker/model/optimizers.h"

namespace dtrain {

struct OptimizerChoice {
  OptimizerConfig optimizer;
  SchedulerConfig schedule;  // the spec's (none when the recipe's schedulers are used)
  // configure_optimizers' record, when the job trains with it: its schedulers replace the
  // spec's schedule.
  std::optional<v1::OptimizationRecipe> recipe;
  // "configure_optimizers: AdamW (2 param groups)", "the spec's optimizer: SGD lr 0.1", ...
  std::string description;
};

// The spec's optimizer and schedule, checked on a throwaway parameter before anything heavier
// is loaded. INVALID_ARGUMENT under spec.optimizer or spec.lr_scheduler.
absl::Status CheckSpecOptimizer(const v1::JobSpec& spec);

// The choice for a normalized `spec` and the model's record (`optimization_json`, "" when it
// has none). INVALID_ARGUMENT under spec.model when the record does not parse or names what
// dtrain lacks.
absl::StatusOr<OptimizerChoice> ChooseOptimizer(const v1::JobSpec& spec,
                                                const std::string& optimization_json);

}  // namespace dtrain

#include "coordinator/jobs/metrics_logger.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/jobs/metric_names.h"

namespace dtrain {

absl::Status MetricsLogger::OnTrainBatchesEnd(TrainerControl& trainer,
                                              const TrainBatches& batches) {
  const int64_t every = trainer.spec().trainer().log_every_n_steps();
  // self.log's per-step values: a point at each step of the cadence, whatever the call's size.
  std::set<std::string> logged_names;
  for (const TrainBatches::StepValues& at : batches.step_logged) {
    for (const auto& [name, value] : at.values) {
      logged_names.insert(name);
      if (every > 0 && at.step % every == 0) trainer.LogMetricAt(name, value, at.step);
    }
  }
  for (const auto& [name, value] : batches.epoch_logged) {
    logged_names.insert(name);
    trainer.LogMetric(name, value);
  }
  if (!ShouldLog(batches.step_before, trainer.global_step(), every, batches.epoch_end)) {
    return absl::OkStatus();
  }
  // What the steps returned, under dtrain's train_ names; a name the model logged itself wins.
  if (logged_names.count("train_loss") == 0) {
    trainer.LogMetric("train_loss", trainer.state().train_loss);
  }
  for (const auto& [name, value] : batches.means) {
    if (name == "loss") continue;
    const std::string key = name == "grad_norm" ? name : StageMetricName("train_", name);
    if (logged_names.count(key) == 0) trainer.LogMetric(key, value);
  }
  return absl::OkStatus();
}

absl::Status MetricsLogger::OnTrainEpochEnd(TrainerControl& trainer) {
  const TrainingState& state = trainer.state();
  // The training rate (JobProgress.train_samples_per_second): validation and checkpoints
  // between the calls are not training.
  trainer.Log(absl::StrCat("epoch ", state.epoch, " done: step ", state.global_step,
                           ", train_loss ", absl::SixDigits(state.train_loss), ", training at ",
                           absl::SixDigits(state.train_samples_per_second()), " samples/s"));
  return absl::OkStatus();
}

namespace {

std::string Report(TrainerControl& trainer, const ValidationMetrics& metrics) {
  for (const auto& [name, value] : metrics.step_logged) trainer.LogMetric(name, value);
  std::vector<std::string> parts;
  for (const auto& [name, value] : metrics.overall) {
    trainer.LogMetric(name, value);
    parts.push_back(absl::StrCat(name, "=", absl::SixDigits(value)));
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace

absl::Status MetricsLogger::OnValidationEnd(TrainerControl& trainer,
                                            const ValidationMetrics& metrics) {
  const std::string values = Report(trainer, metrics);
  trainer.Log(absl::StrCat("validation at epoch ", trainer.epoch(), " step ", trainer.global_step(),
                           ": ", values));
  return absl::OkStatus();
}

absl::Status MetricsLogger::OnTestEnd(TrainerControl& trainer, const ValidationMetrics& metrics) {
  trainer.Log(absl::StrCat("test: ", Report(trainer, metrics)));
  return absl::OkStatus();
}

}  // namespace dtrain

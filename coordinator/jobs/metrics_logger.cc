#include "coordinator/jobs/metrics_logger.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/jobs/metric_names.h"

namespace dtrain {

absl::Status MetricsLogger::OnTrainBatchesEnd(TrainerControl& trainer,
                                              const TrainBatches& batches) {
  if (!ShouldLog(batches.step_before, trainer.global_step(),
                 trainer.spec().trainer().log_every_n_steps(), batches.epoch_end)) {
    return absl::OkStatus();
  }
  trainer.LogMetric("train_loss", trainer.state().train_loss);
  for (const auto& [name, value] : batches.means) {
    if (name == "loss") continue;
    trainer.LogMetric(name == "grad_norm" ? name : StageMetricName("train_", name), value);
  }
  return absl::OkStatus();
}

absl::Status MetricsLogger::OnTrainEpochEnd(TrainerControl& trainer) {
  const TrainingState& state = trainer.state();
  const double seconds = absl::ToDoubleSeconds(trainer.Now() - state.fit_start);
  const double rate = seconds > 0 ? static_cast<double>(state.samples_done) / seconds : 0;
  trainer.Log(absl::StrCat("epoch ", state.epoch, " done: step ", state.global_step,
                           ", train_loss ", absl::SixDigits(state.train_loss), ", ",
                           absl::SixDigits(rate), " samples/s"));
  return absl::OkStatus();
}

namespace {

std::string Report(TrainerControl& trainer, const ValidationMetrics& metrics) {
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

#include "coordinator/jobs/learning_rate_monitor.h"

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/metrics_logger.h"

namespace dtrain {

std::string LearningRateMonitor::MetricName(const std::string& optimizer) {
  // torch.optim's class names, as Lightning's monitor writes them.
  if (optimizer == "sgd") return "lr-SGD";
  if (optimizer == "adam") return "lr-Adam";
  if (optimizer == "adamw") return "lr-AdamW";
  return absl::StrCat("lr-", optimizer);
}

absl::Status LearningRateMonitor::OnTrainBatchesEnd(TrainerControl& trainer,
                                                    const TrainBatches& batches) {
  if (batches.result == nullptr || batches.result->ranks.empty()) return absl::OkStatus();
  if (!MetricsLogger::ShouldLog(batches.step_before, trainer.global_step(),
                                trainer.spec().trainer().log_every_n_steps(), batches.epoch_end)) {
    return absl::OkStatus();
  }
  // Every rank steps the same schedule; rank 0's is the job's.
  const double lr = batches.result->ranks.front().lr;
  if (lr > 0) trainer.LogMetric(MetricName(trainer.spec().optimizer().name()), lr);
  return absl::OkStatus();
}

}  // namespace dtrain

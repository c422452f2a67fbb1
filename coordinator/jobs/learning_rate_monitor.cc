#include "coordinator/jobs/learning_rate_monitor.h"

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/metrics_logger.h"

namespace dtrain {

std::string LearningRateMonitor::MetricName(const std::string& optimizer) {
  // torch.optim's class names, as Lightning's monitor writes them.
  if (optimizer.empty() || optimizer == "sgd") return "lr-SGD";  // "": the default
  if (optimizer == "adam") return "lr-Adam";
  if (optimizer == "adamw") return "lr-AdamW";
  return absl::StrCat("lr-", optimizer);
}

absl::Status LearningRateMonitor::OnTrainBatchesEnd(TrainerControl& trainer,
                                                    const TrainBatches& batches) {
  if (batches.result == nullptr || batches.result->ranks.empty()) return absl::OkStatus();
  // Every rank steps the same schedule; rank 0's is the job's. Per step, each param group's
  // rate at the training metrics' cadence, whatever the call's size.
  const int64_t every = trainer.spec().trainer().log_every_n_steps();
  int64_t step = batches.step_before;
  bool per_step = false;
  for (const BatchScalars& batch : batches.result->ranks.front().batches) {
    if (!batch.optimizer_stepped) continue;
    ++step;
    if (batch.learning_rates.empty()) continue;
    per_step = true;
    const bool last = step == trainer.global_step() && batches.epoch_end;
    if (every <= 0 || (step % every != 0 && !last)) continue;
    for (const auto& [name, lr] : batch.learning_rates) trainer.LogMetricAt(name, lr, step);
  }
  if (per_step) return absl::OkStatus();
  if (!MetricsLogger::ShouldLog(batches.step_before, trainer.global_step(),
                                trainer.spec().trainer().log_every_n_steps(), batches.epoch_end)) {
    return absl::OkStatus();
  }
  // Workers that report no per-step rates: the call's last one.
  const double lr = batches.result->ranks.front().lr;
  if (lr > 0) trainer.LogMetric(MetricName(trainer.spec().optimizer().name()), lr);
  return absl::OkStatus();
}

}  // namespace dtrain

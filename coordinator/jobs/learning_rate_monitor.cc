#include "coordinator/jobs/learning_rate_monitor.h"

namespace dtrain {

absl::Status LearningRateMonitor::OnTrainBatchesEnd(TrainerControl& trainer,
                                                    const TrainBatches& batches) {
  if (batches.result == nullptr || batches.result->ranks.empty()) return absl::OkStatus();
  // Every rank steps the same schedule; rank 0's is the job's. Per step, each param group's
  // rate at the training metrics' cadence, whatever the call's size.
  const int64_t every = trainer.spec().trainer().log_every_n_steps();
  int64_t step = batches.step_before;
  for (const BatchScalars& batch : batches.result->ranks.front().batches) {
    if (!batch.optimizer_stepped) continue;
    ++step;
    const bool last = step == trainer.global_step() && batches.epoch_end;
    if (every <= 0 || (step % every != 0 && !last)) continue;
    for (const auto& [name, lr] : batch.learning_rates) trainer.LogMetricAt(name, lr, step);
  }
  return absl::OkStatus();
}

}  // namespace dtrain

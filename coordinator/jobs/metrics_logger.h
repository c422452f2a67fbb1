// MetricsLogger, as Lightning's logger connector: training's scalars every
// trainer.log_every_n_steps optimizer steps and at each epoch's end (train_loss, train_<key> for
// training_step's other keys, grad_norm), every validation's and test's metrics, and a line in
// the job log for each epoch, validation and test.
#pragma once

#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

class MetricsLogger final : public TrainerCallback {
 public:
  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override;
  absl::Status OnTrainEpochEnd(TrainerControl& trainer) override;
  absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics) override;
  absl::Status OnTestEnd(TrainerControl& trainer, const ValidationMetrics& metrics) override;

  // Whether a training call that moved the global step from `step_before` to `step` (or ended
  // an epoch) is one to log at, every `every` steps: the cadence every training metric shares.
  static bool ShouldLog(int64_t step_before, int64_t step, int64_t every, bool epoch_end) {
    return epoch_end || (every > 0 && step / every != step_before / every);
  }
};

}  // namespace dtrain

// LearningRateMonitor, as Lightning's: the learning rate of each optimizer step (after its
// schedule), logged as lr-<Optimizer> (lr-SGD, lr-Adam, lr-AdamW), or lr-<Optimizer>/pg<i> per
// param group when there are several, at the training metrics' cadence (every
// trainer.log_every_n_steps optimizer steps and at each epoch's end), as the workers name and
// report them per step (BatchResult.learning_rates).
#pragma once

#include <string>

#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

class LearningRateMonitor final : public TrainerCallback {
 public:
  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override;
};

}  // namespace dtrain

// ProgressReporter, as Lightning's progress bar: the job's progress (phase, epoch, batch, step,
// train_loss, samples per second, the ETA, seconds per phase) to the job's record at every
// change, which `dtrain watch`, the dashboard and the API show; and, when the run ends, where
// its seconds went ("time by phase: ...").
#pragma once

#include "coordinator/jobs/trainer_callback.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

class ProgressReporter final : public TrainerCallback {
 public:
  void OnProgress(TrainerControl& trainer) override { Report(trainer); }
  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override {
    Report(trainer);
    return absl::OkStatus();
  }
  void OnRunEnd(TrainerControl& trainer, const absl::Status& status) override;

 private:
  void Report(TrainerControl& trainer);

  v1::JobProgress progress_;
};

}  // namespace dtrain

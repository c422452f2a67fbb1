// RankTiming: where training's wall time went on each rank: its own work, and of that the time
// waiting for the other ranks' gradients (the communication backward did not hide, and the lead
// of a faster rank over a slower one); what no rank spent is the coordinator's, driving the
// steps between the ranks' batches. One line in the job log once fit ends ("time by rank: ...").
#pragma once

#include <map>
#include <utility>

#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

class RankTiming final : public TrainerCallback {
 public:
  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override;
  absl::Status OnTrainEnd(TrainerControl& trainer) override;

 private:
  // Per rank: seconds in training steps, and of those, waiting for the others' gradients.
  std::map<int, std::pair<double, double>> seconds_;
};

}  // namespace dtrain

// EarlyStopping, as Lightning's callback: each rank judges its own monitored validation metric
// (improved by min_delta, or not for `patience` validations), then the ranks agree through
// reduce_boolean_decision(any), so one rank's verdict stops them all. A monitored training
// epoch value (self.log with on_epoch) is one value over every rank, judged the same on each;
// with validation off it is judged at each epoch's end (monitored_metric.h).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/jobs/trainer_callback.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

class EarlyStopping final : public TrainerCallback {
 public:
  explicit EarlyStopping(v1::EarlyStoppingConfig config) : config_(std::move(config)) {}

  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override;
  absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics) override;
  // Lightning's: wait_count, stopped_epoch, best_score (a 0-dim tensor) and patience, under
  // "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"; rank 0's, given to every rank back.
  std::optional<v1::CallbackState> StateDict() const override;
  void LoadStateDict(const std::vector<v1::CallbackState>& states) override;

 private:
  // The verdict on each rank's value of the monitor (by_rank[r]; a rank without it has no say).
  absl::Status Judge(TrainerControl& trainer,
                     const std::vector<std::map<std::string, double>>& by_rank);

  struct RankState {
    double best = 0;
    bool has_best = false;
    int wait = 0;
  };
  const v1::EarlyStoppingConfig config_;
  std::vector<RankState> ranks_;
  RankState restored_;  // every rank's state until the first verdict, in a resumed run
  int64_t stopped_epoch_ = 0;
  std::map<std::string, double> train_values_;  // the latest training epoch values
};

}  // namespace dtrain

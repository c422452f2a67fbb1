// EarlyStopping, as Lightning's callback: each rank judges its own monitored validation metric
// (improved by min_delta, or not for `patience` validations), then the ranks agree through
// reduce_boolean_decision(any), so one rank's verdict stops them all.
#pragma once

#include <vector>

#include "coordinator/jobs/trainer_callback.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

class EarlyStopping final : public TrainerCallback {
 public:
  explicit EarlyStopping(v1::EarlyStoppingConfig config) : config_(std::move(config)) {}

  absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics) override;

 private:
  struct RankState {
    double best = 0;
    bool has_best = false;
    int wait = 0;
  };
  const v1::EarlyStoppingConfig config_;
  std::vector<RankState> ranks_;
};

}  // namespace dtrain

// PredictionWriter, as Lightning's BasePredictionWriter: predict_step's per-sample outputs to
// <dir>/predictions.csv, one row per sample in sample order ("index" then one column per output
// with one value per sample), reported as the job's predictions.
#pragma once

#include <string>

#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

class PredictionWriter final : public TrainerCallback {
 public:
  explicit PredictionWriter(std::string dir) : path_(dir + "/predictions.csv") {}

  absl::Status OnPredictEnd(TrainerControl& trainer, const PredictionRows& predictions) override;

 private:
  const std::string path_;
};

}  // namespace dtrain

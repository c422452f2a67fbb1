// ModelCheckpoint, as Lightning's callback: a checkpoint every `every_n_steps` optimizer steps
// and at the end of fit (last.ckpt), and at each validation either the top k by a monitored
// metric (epoch=E-step=S.ckpt; evicted files are deleted) or, with no monitor, last.ckpt.
// The top k survive a new run of the job (re-formed, resumed after a coordinator restart): it
// starts from the files the job kept, with their monitored values.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coordinator/jobs/trainer_callback.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

class ModelCheckpoint final : public TrainerCallback {
 public:
  // `kept`: the job's files so far (JobStatus.files).
  ModelCheckpoint(v1::CheckpointConfig config, const std::vector<v1::JobFile>& kept);

  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override;
  absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics) override;
  absl::Status OnTrainEnd(TrainerControl& trainer) override;

  static constexpr char kLastName[] = "last.ckpt";
  // The best kept checkpoint's name; "" before the first.
  std::string best_name() const { return top_k_.empty() ? "" : top_k_.front().second; }

  // The other *.ckpt files in a shared directory's `path`, newest first: where a resume looks
  // when `path` is unreadable. Empty when the coordinator does not see that directory.
  static std::vector<std::string> Siblings(const std::string& path);

 private:
  bool Better(double a, double b) const;

  const v1::CheckpointConfig config_;
  // Kept checkpoints by monitored value: (value, name), best first.
  std::vector<std::pair<double, std::string>> top_k_;
};

}  // namespace dtrain

// ModelCheckpoint, as Lightning's callback: a checkpoint every `every_n_steps` optimizer steps
// and at the end of fit (last.ckpt), and at each validation (of every `every_n_epochs`-th
// epoch; at each epoch's end when validation is off) either the top k by a monitored metric
// (named by the `filename` template, epoch=E-step=S.ckpt by default; evicted files are
// deleted; k = -1 keeps all, 0 none) or, with no monitor, last.ckpt. The monitor may be a
// validation metric or a training epoch value the model logs (self.log's on_epoch).
// The top k survive a new run of the job (re-formed, resumed after a coordinator restart): it
// starts from the files the job kept, with their monitored values.
#pragma once

#include <map>
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
  // The epoch's save: last.ckpt without a monitor, else the top-k logic. `validation` holds
  // the validation's metrics (empty when validation is off).
  absl::Status SaveForEpoch(TrainerControl& trainer,
                            const std::map<std::string, double>& validation);

  const v1::CheckpointConfig config_;
  // Kept checkpoints by monitored value: (value, name), best first.
  std::vector<std::pair<double, std::string>> top_k_;
  // The latest training epoch values the model logged, by name.
  std::map<std::string, double> train_values_;
};

}  // namespace dtrain

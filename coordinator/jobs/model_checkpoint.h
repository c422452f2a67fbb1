// ModelCheckpoint, as Lightning's callback: a checkpoint every `every_n_steps` optimizer steps
// and at the end of fit (last.ckpt), and at each validation either the top k by a monitored
// metric (epoch=E-step=S.ckpt; evicted files are deleted) or, with no monitor, last.ckpt.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coordinator/jobs/trainer_callback.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

class ModelCheckpoint final : public TrainerCallback {
 public:
  ModelCheckpoint(v1::CheckpointConfig config, std::string dir);

  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, int64_t step_before) override;
  absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics,
                               bool* stop) override;
  absl::Status OnTrainEnd(TrainerControl& trainer) override;

  std::string last_path() const { return dir_ + "/last.ckpt"; }

  // The other *.ckpt files in `path`'s directory, newest first: where a resume looks when
  // `path` is unreadable. Empty when the coordinator does not see that directory.
  static std::vector<std::string> Siblings(const std::string& path);

 private:
  const v1::CheckpointConfig config_;
  const std::string dir_;
  // Kept checkpoints by monitored value: (value, path), best first.
  std::vector<std::pair<double, std::string>> top_k_;
};

}  // namespace dtrain

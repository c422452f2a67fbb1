// FitLoop: fit's epochs, as Lightning's fit loop and training epoch loop: each epoch every rank
// trains on its DistributedSampler shard (shuffled by seed_everything and the epoch) in batches
// of data.batch_size, several batches per training call (StepCallSizer), validating every
// val_check_interval; fit ends after max_epochs, at max_steps, or when a callback asks to stop
// (EarlyStopping). Calls end at validation, max_steps and checkpoint.every_n_steps boundaries. A
// run resumed mid-epoch starts at the batch after the last optimizer step.
//
// A worker that is stopping (drained) is let go at an optimizer-step boundary, after a
// checkpoint every rank writes, so the job resumes exactly there: the loop then ends with
// UNAVAILABLE naming it (drained()).
//
// Thread-safety: none; the job's thread runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/jobs/evaluation_loop.h"
#include "coordinator/jobs/logged_metrics.h"
#include "coordinator/jobs/loop_context.h"

namespace dtrain {

class FitLoop {
 public:
  // `draining`: which of the run's workers are stopping now (null: none ever).
  FitLoop(LoopContext& context, EvaluationLoop& validation,
          std::function<std::vector<std::string>()> draining)
      : context_(context), validation_(validation), draining_(std::move(draining)) {}

  // From epoch `start_epoch`, batch `start_batch` (a resumed run), to the end of fit. CANCELLED
  // once the workers were cancelled; UNAVAILABLE after letting stopping workers go.
  absl::Status Run(int64_t start_epoch, int64_t start_batch);

  // Workers let go because they were stopping.
  const std::vector<std::string>& drained() const { return drained_; }

 private:
  absl::Status TrainEpoch(int64_t epoch, int64_t start_batch);
  // One training call of `count` batches from batch `first` of every rank's epoch.
  absl::Status TrainingCall(const RankBatches& batches, int64_t first, int64_t count);
  // Checkpoints and ends fit so that `names` (stopping) can leave.
  absl::Status LetDrainingWorkersGo(std::vector<std::string> names);

  LoopContext& context_;
  EvaluationLoop& validation_;
  const std::function<std::vector<std::string>()> draining_;
  std::vector<std::string> drained_;
  LoggedAggregates train_logged_;  // this epoch's on_epoch values from training
  bool first_step_seen_ = false;
};

}  // namespace dtrain

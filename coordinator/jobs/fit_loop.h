// FitLoop: fit's epochs, as Lightning's fit loop and training epoch loop: each epoch every rank
// trains on its DistributedSampler shard (shuffled by seed_everything and the epoch) in batches
// of data.batch_size, several batches per training call (StepCallSizer), validating every
// val_check_interval; fit ends after max_epochs, at max_steps, or when a callback asks to stop
// (EarlyStopping). Calls end at validation, max_steps and checkpoint.every_n_steps boundaries. A
// run resumed mid-epoch starts at the batch after the last optimizer step. Mid-epoch, the next
// call is sent before the last one answers (trainer.pipelined_calls), so the workers do not wait
// for the coordinator's round trip between calls.
//
// A worker that is stopping (drained) is let go at an optimizer-step boundary, after a
// checkpoint every rank writes, so the job resumes exactly there: the loop then ends with
// UNAVAILABLE naming it (drained()).
//
// Thread-safety: none; the job's thread runs it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
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
  // A training call sent (StartTrain) and not yet received.
  struct SentCall {
    TrainCall call;
    absl::Time sent;
    bool pipelined = false;        // sent while the call before it was in flight
    bool validates_after = false;  // validation comes at its end
    int64_t steps_before = 0;      // the global step it starts from (counted ahead if pipelined)
  };

  absl::Status TrainEpoch(int64_t epoch, int64_t start_batch);
  // Sends a training call of `count` batches from batch `first` of every rank's epoch.
  absl::Status SendCall(const RankBatches& batches, int64_t first, int64_t count,
                        bool validates_after, int64_t steps_before, std::deque<SentCall>* sent);
  // Waits for the oldest call sent and counts what it did. `next_starts_at`: the global step the
  // call sent after it (in flight) was planned from, which its answer must confirm.
  absl::Status ReceiveCall(const SentCall& sent, std::optional<int64_t> next_starts_at);
  // The time the run spent in phases that may come between training calls.
  absl::Duration ElsewhereThanTraining() const;
  // Checkpoints and ends fit so that `names` (stopping) can leave.
  absl::Status LetDrainingWorkersGo(std::vector<std::string> names);

  LoopContext& context_;
  EvaluationLoop& validation_;
  const std::function<std::vector<std::string>()> draining_;
  std::vector<std::string> drained_;
  LoggedAggregates train_logged_;  // this epoch's on_epoch values from training
  bool first_step_seen_ = false;
  absl::Time last_answer_ = absl::InfinitePast();  // when the last training call answered
};

}  // namespace dtrain

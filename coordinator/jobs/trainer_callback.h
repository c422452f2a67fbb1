// Trainer callbacks, as Lightning's: behaviour at the loops' boundaries that is not the loops
// themselves. Logging (MetricsLogger), progress and the ETA (ProgressReporter), per-rank timing
// (RankTiming), the learning rate (LearningRateMonitor), checkpoints (ModelCheckpoint), early
// stopping (EarlyStopping) and predictions (PredictionWriter) are callbacks; the trainer calls
// them in the order it lists them (trainer.cc). Each sees the run through TrainerControl,
// never the workers directly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/jobs/training_state.h"
#include "coordinator/jobs/worker_group.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// What a callback may ask of the running trainer.
class TrainerControl {
 public:
  virtual ~TrainerControl() = default;
  virtual const TrainingState& state() const = 0;
  virtual const v1::JobSpec& spec() const = 0;  // normalized
  // The run's clock (injected: tests advance it by hand).
  virtual absl::Time Now() const = 0;

  int64_t global_step() const { return state().global_step; }
  int64_t epoch() const { return state().epoch; }
  int world_size() const { return state().world_size; }

  // Every rank saves; rank 0 writes the file `name` in the job's checkpoint directory (its
  // own, whose files go to the coordinator's store, or the workers' shared dirpath), then
  // removes `evict` there. It becomes the job's last checkpoint; `monitored` is kept with it
  // (top-k across a restart of the coordinator).
  struct Save {
    std::string name;
    std::vector<std::string> evict;
    std::optional<double> monitored;
  };
  virtual absl::Status SaveCheckpoint(const Save& save) = 0;
  // The job's best checkpoint by the monitored metric (a name given to SaveCheckpoint).
  virtual void SetBestCheckpoint(const std::string& name) = 0;
  // Whether any rank decided true, agreed by the ranks themselves (reduce_boolean_decision with
  // all=false on the workers), so a stop is the group's decision as in Lightning.
  virtual absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) = 0;
  // Ends fit at the next boundary (Lightning's trainer.should_stop).
  virtual void RequestStop() = 0;

  // The job's log, its metric points (at the current step and epoch), its progress, and its
  // predictions file.
  virtual void Log(const std::string& line) = 0;
  virtual void LogMetric(const std::string& name, double value) = 0;
  // A point at an earlier step of the current epoch (a step inside the last training call).
  virtual void LogMetricAt(const std::string& name, double value, int64_t step) = 0;
  virtual void ReportProgress(const v1::JobProgress& progress) = 0;
  virtual void ReportPredictions(const std::string& path) = 0;
};

// One validation or test run's metrics (val_loss, val_acc, ...): sample-weighted over all ranks,
// and each rank's own.
struct ValidationMetrics {
  std::map<std::string, double> overall;
  // Per-step values model code logged with on_step (rank 0's, in batch order).
  std::vector<std::pair<std::string, double>> step_logged;
  std::vector<std::map<std::string, double>> by_rank;
};

// One predict batch as a rank returned it, with the sample index of each of its rows (the
// rows it kept, under on_error: skip).
struct PredictedSamples {
  int rank = 0;
  int64_t batch_idx = 0;
  const std::vector<int64_t>& indices;
  const PredictedBatch& batch;
};

// One training call, as the fit loop counted it.
struct TrainBatches {
  int64_t step_before = 0;  // the global step before the call
  int64_t batches = 0;      // per rank
  bool epoch_end = false;   // the call ended the epoch
  // Every scalar the steps returned, averaged over the call's batches on every rank: "loss",
  // training_step's other keys, grad_norm when clipping.
  std::map<std::string, double> means;
  // What model code logged (self.log), by the names Lightning gives them: rank 0's per-step
  // values of each batch that ended an optimizer step, with the global step after it; and, when
  // the call ends the epoch, the epoch's aggregates over every rank.
  struct StepValues {
    int64_t step = 0;
    std::map<std::string, double> values;
  };
  std::vector<StepValues> step_logged;
  std::map<std::string, double> epoch_logged;
  const TrainResult* result = nullptr;  // per rank: lr, timing, batches
};

class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  // The run's progress changed (a phase began, a training call ended).
  virtual void OnProgress(TrainerControl& trainer) {}
  // After each training call, once the optimizer steps are counted.
  virtual absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) {
    return absl::OkStatus();
  }
  virtual absl::Status OnTrainEpochEnd(TrainerControl& trainer) { return absl::OkStatus(); }
  // After each validation: during fit (then RequestStop ends fit), and in stage validate.
  virtual absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics) {
    return absl::OkStatus();
  }
  virtual absl::Status OnTestEnd(TrainerControl& trainer, const ValidationMetrics& metrics) {
    return absl::OkStatus();
  }
  // Once fit's epochs are over (or it stopped early).
  virtual absl::Status OnTrainEnd(TrainerControl& trainer) { return absl::OkStatus(); }
  // After predict_step over the predict (or test) split.
  // Lightning's on_predict_batch_end, as each call's batches arrive, then on_predict_end.
  virtual absl::Status OnPredictBatch(TrainerControl& trainer, const PredictedSamples& batch) {
    return absl::OkStatus();
  }
  virtual absl::Status OnPredictEnd(TrainerControl& trainer) { return absl::OkStatus(); }
  // The run is over, with `status` (also when it failed or was cancelled).
  virtual void OnRunEnd(TrainerControl& trainer, const absl::Status& status) {}
  // Lightning's callback state_dict, kept in each checkpoint's "callbacks" under its key.
  virtual std::optional<v1::CallbackState> StateDict() const { return std::nullopt; }
  // A resumed run: the checkpoint's callback states; each callback takes its own key's.
  virtual void LoadStateDict(const std::vector<v1::CallbackState>& states) {}
};

// The callbacks in order, each hook called on every one; a failing hook stops the others.
// `round_end` runs after every hook's round (the trainer stores the round's metric points).
class CallbackList {
 public:
  CallbackList(TrainerControl* trainer, std::vector<std::unique_ptr<TrainerCallback>> callbacks,
               std::function<void()> round_end)
      : trainer_(trainer), callbacks_(std::move(callbacks)), round_end_(std::move(round_end)) {}

  void Progress() {
    for (const auto& c : callbacks_) c->OnProgress(*trainer_);
    round_end_();
  }
  absl::Status TrainBatchesEnd(const TrainBatches& batches) {
    return Each([&](TrainerCallback& c) { return c.OnTrainBatchesEnd(*trainer_, batches); });
  }
  absl::Status TrainEpochEnd() {
    return Each([&](TrainerCallback& c) { return c.OnTrainEpochEnd(*trainer_); });
  }
  absl::Status ValidationEnd(const ValidationMetrics& metrics) {
    return Each([&](TrainerCallback& c) { return c.OnValidationEnd(*trainer_, metrics); });
  }
  absl::Status TestEnd(const ValidationMetrics& metrics) {
    return Each([&](TrainerCallback& c) { return c.OnTestEnd(*trainer_, metrics); });
  }
  absl::Status TrainEnd() {
    return Each([&](TrainerCallback& c) { return c.OnTrainEnd(*trainer_); });
  }
  absl::Status PredictBatch(const PredictedSamples& batch) {
    return Each([&](TrainerCallback& c) { return c.OnPredictBatch(*trainer_, batch); });
  }
  absl::Status PredictEnd() {
    return Each([&](TrainerCallback& c) { return c.OnPredictEnd(*trainer_); });
  }
  void RunEnd(const absl::Status& status) {
    for (const auto& c : callbacks_) c->OnRunEnd(*trainer_, status);
    round_end_();
  }
  std::vector<v1::CallbackState> StateDicts() const {
    std::vector<v1::CallbackState> out;
    for (const auto& c : callbacks_) {
      if (std::optional<v1::CallbackState> s = c->StateDict()) out.push_back(*std::move(s));
    }
    return out;
  }
  void LoadStateDicts(const std::vector<v1::CallbackState>& states) {
    for (const auto& c : callbacks_) c->LoadStateDict(states);
  }

 private:
  template <typename F>
  absl::Status Each(F&& hook) {
    absl::Status status;
    for (const auto& c : callbacks_) {
      status = hook(*c);
      if (!status.ok()) break;
    }
    round_end_();
    return status;
  }

  TrainerControl* const trainer_;
  const std::vector<std::unique_ptr<TrainerCallback>> callbacks_;
  const std::function<void()> round_end_;
};

}  // namespace dtrain

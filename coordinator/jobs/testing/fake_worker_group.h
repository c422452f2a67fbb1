// FakeWorkerGroup: an in-process WorkerGroup for the loops' unit tests: no processes, no gRPC,
// no sleeps. Its ranks train a model of one weight `w` by SGD as data-parallel ranks would:
// sample i's target is (i % 10) / 10, a batch's loss is the mean of (w - target)^2, every
// rank's gradient is averaged (in rank order, so results are exact and reproducible), gradients
// accumulate over trainer.accumulate_grad_batches batches across calls and the last batch of an
// epoch closes the window, as the worker does. Validation and test report loss and acc (the
// share of samples within 0.15 of w) per batch; predict returns a per-sample "label" and
// "score" and a [batch, 2] "logits" that is no column. Checkpoints live in a FakeCheckpointStore
// that outlives a run, so a re-formed or resumed run loads what an earlier one saved.
//
// Tests script the rest: validation metrics by (validation, rank) for early stopping and top-k,
// and a hook before every call that may fail it or mark a worker lost (as the registry's
// monitor does from its own thread).
//
// Thread-safety: one thread makes the calls; Cancel and MarkLost from any.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/jobs/worker_group.h"

namespace dtrain::testing {

struct FakeCheckpoint {
  double weight = 0;
  int64_t global_step = 0;
  int64_t epoch = 0;
  int64_t total_steps = 0;  // what the save carried for schedules of the run's length
};

// The checkpoint files the fake's workers write, by name, and what the coordinator's store would
// keep of them, by digest. Find takes a path as a worker gets it: "artifact:sha256:<hex>" (the
// stored content) or a path whose last part is the name ("job:j/last.ckpt", "/d/last.ckpt").
class FakeCheckpointStore {
 public:
  // Returns the content's digest ("sha256:<hex>").
  std::string Put(const std::string& name, FakeCheckpoint checkpoint);
  void Remove(const std::string& name) { files_.erase(name); }
  const FakeCheckpoint* Find(const std::string& path) const;
  std::set<std::string> names() const;

 private:
  std::map<std::string, FakeCheckpoint> files_;
  std::map<std::string, FakeCheckpoint> stored_;  // by digest; never removed, as a store's blobs
};

// One call the group received.
struct FakeCall {
  std::string what;        // setup, training_step, validation_step, test_step, predict_step,
                           // save_checkpoint, load_checkpoint, reduce_boolean_decision
  int index = 0;           // among calls of the same kind, from 0
  int64_t batches = 0;     // training: the batches each rank runs in the call
  int64_t first = 0;       // training: the call's first batch
  bool pipelined = false;  // training: started while the call before it was unfinished
  bool listed = false;     // training: its batches came as index lists, not a sampler's settings
};

// One batch a rank trained on.
struct TrainedBatch {
  int64_t epoch = 0;
  int rank = 0;
  std::vector<int64_t> indices;
};

struct FakeWorkerGroupOptions {
  std::vector<std::string> workers = {"w0", "w1"};
  std::map<std::string, int64_t> splits = {{"train", 64}, {"val", 16}, {"test", 16}};
  double initial_weight = 0;
  // Validation metrics (without the val_ prefix) of rank `rank` at the `validation`-th
  // validation of the run; null: the model's own loss and acc.
  std::function<std::map<std::string, double>(int validation, int rank)> validation_metrics;
  // What rank `rank`'s model logs (self.log) in training batch `batch` of `epoch`.
  std::function<std::map<std::string, LoggedValue>(int64_t epoch, int64_t batch, int rank)>
      training_logged;
  // Before every call, with the group (to MarkLost or Cancel it); a non-OK status fails the call
  // as that worker's error would.
  std::function<absl::Status(const FakeCall& call)> before_call;
  // Where checkpoints go; null: the group's own.
  FakeCheckpointStore* store = nullptr;
  // The workers deal a training call's batches from its sampler settings, as today's workers
  // do (GroupSetup.sampled_work); otherwise they must be listed. other_deals: what the group
  // reports of workers that deal otherwise (GroupSetup.other_deals).
  bool sampled_work = false;
  std::vector<std::string> other_deals;
};

class FakeWorkerGroup final : public WorkerGroup {
 public:
  explicit FakeWorkerGroup(FakeWorkerGroupOptions options);

  int size() const override { return static_cast<int>(options_.workers.size()); }
  absl::StatusOr<GroupSetup> Setup(const v1::JobSpec& spec, const SetupContext& context,
                                   bool clear_stale_runs) override;
  absl::StatusOr<TrainResult> Train(const TrainCall& call) override;
  // Pipelined calls (WorkerGroup::StartTrain): each runs in FinishTrain, in order. Any other call
  // that comes while a training call is unfinished fails INTERNAL, as it would overtake the
  // training a worker had queued: every loop test checks that nothing comes between two
  // pipelined calls.
  void StartTrain(const TrainCall& call) override;
  absl::StatusOr<TrainResult> FinishTrain() override;
  void AbandonTrain() override;
  absl::StatusOr<EvalResult> Evaluate(EvalKind kind, const RankBatches& batches) override;
  absl::StatusOr<PredictResult> Predict(const PredictCall& call) override;
  absl::StatusOr<SavedCheckpoint> Save(const SaveCall& call) override;
  absl::StatusOr<LoadedCheckpoint> Load(const std::string& path) override;
  absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) override;
  void Teardown() override;
  void Cancel() override;
  bool cancelled() const override;
  void MarkLost(const std::string& worker, const std::string& why) override;
  std::vector<std::string> unreachable() const override;
  std::vector<std::string> lost() const override;

  // What the group saw and holds.
  double weight() const { return weight_; }
  int64_t global_step() const { return global_step_; }
  const std::vector<TrainedBatch>& trained() const { return trained_; }
  const std::vector<FakeCall>& calls() const { return calls_; }
  int abandoned() const { return abandoned_; }  // training calls AbandonTrain dropped
  // Per validation, test or sanity call, in order: the most batches a rank had.
  const std::vector<int64_t>& evaluated() const { return evaluated_; }
  int count(const std::string& what) const;
  const FakeCheckpointStore& store() const { return *store_; }
  bool torn_down() const { return torn_down_; }
  const SetupContext& context() const { return context_; }

 private:
  // Counts the call, runs the hook, then answers CANCELLED or the lost worker's UNAVAILABLE as
  // RunWorkers would.
  absl::Status Begin(const std::string& what, int64_t batches = 0);
  std::string Describe(int worker) const;
  static double Target(int64_t index) { return static_cast<double>(index % 10) / 10.0; }
  // Mean loss and share within 0.15 of w over a batch.
  std::map<std::string, double> Measure(const std::vector<int64_t>& indices) const;

  FakeWorkerGroupOptions options_;
  FakeCheckpointStore own_store_;
  FakeCheckpointStore* store_;
  v1::JobSpec spec_;
  SetupContext context_;
  int world_ = 1;
  double weight_ = 0;
  int64_t global_step_ = 0;
  double gradient_ = 0;  // accumulated over the open window
  int64_t accumulated_ = 0;
  int validations_ = 0;
  std::vector<TrainedBatch> trained_;
  std::vector<int64_t> evaluated_;
  std::vector<FakeCall> calls_;
  std::deque<std::pair<TrainCall, bool>> started_;  // unfinished, with whether pipelined
  int abandoned_ = 0;
  std::map<std::string, int> counts_;
  bool torn_down_ = false;

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> lost_ ABSL_GUARDED_BY(mu_);  // worker -> why
};

}  // namespace dtrain::testing

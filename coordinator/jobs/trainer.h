// The Trainer: runs one job's fit / validate / test / predict loops on the workers placed for
// it, through their step RPCs (as Lightning's Trainer runs its loops on an Accelerator). It sets
// up every worker (they form the job's group), shards the data with a DistributedSampler, sends
// each worker several batches per step RPC and validates at val_check_interval. What happens
// at the loop's boundaries belongs to callbacks (trainer_callback.h): ModelCheckpoint,
// EarlyStopping, PredictionWriter. The run's workers, and every RPC to them, belong to
// RunWorkers. Nothing waits without a deadline.
//
// Thread-safety: Run on one thread; Cancel from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/jobs/job_run.h"
#include "coordinator/jobs/phase_clock.h"
#include "coordinator/jobs/run_workers.h"
#include "coordinator/jobs/step_call_sizer.h"
#include "coordinator/jobs/trainer_callback.h"
#include "dtrain/v1/coordinator.pb.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/worker.grpc.pb.h"

namespace dtrain {

// Where the trainer reports what happens; implemented by the job manager's record of the job.
class TrainerReporter {
 public:
  virtual ~TrainerReporter() = default;
  virtual void Log(const std::string& line) = 0;
  virtual void Progress(const v1::JobProgress& progress) = 0;
  virtual void Metric(const std::string& name, double value, int64_t step, int64_t epoch) = 0;
  // The job's last and best checkpoints, as a spec names them (job:<id>/<name> or a worker
  // path).
  virtual void Checkpoint(const std::string& last, const std::string& best) = 0;
  // A file the job keeps (replacing one of the same name), and those of its files it no longer
  // keeps (top-k eviction).
  virtual void KeepFile(const v1::JobFile& file, const std::vector<std::string>& dropped) = 0;
  virtual void Predictions(const std::string& path) = 0;
};

struct TrainerOptions {
  std::string job_id;
  // Normalized. Its checkpoint.dirpath says where checkpoints go: "" (rank 0 sends them to the
  // coordinator's store) or a directory the workers share ("worker:/path").
  v1::JobSpec spec;
  std::vector<v1::WorkerInfo> workers;  // placed for this job, in placement order
  std::string coordinator;              // the address workers reach the coordinator at
  std::string output_dir;               // the job's directory (predictions)
  // The files the job kept in earlier runs (its top-k checkpoints carry on from them).
  std::vector<v1::JobFile> files;
  // Resolves a spec's "job:<id>/<name>" to what a worker loads (an artifact reference or a
  // worker path); null: references are sent as they are.
  std::function<absl::StatusOr<std::string>(const std::string&)> resolve_file;
  // The job's other checkpoints, newest first, to try when `reference` cannot be read.
  std::function<std::vector<std::string>(const std::string& reference)> sibling_checkpoints;
  // Keeps a file the coordinator wrote (predictions.csv) in its store: its digest.
  std::function<absl::StatusOr<std::string>(const std::string& path)> store_file;
  std::string group;      // the job's group id; "": job_id
  std::string job_token;  // the workers' bearer token in the job's group
  // The job ran before under a coordinator that stopped: its workers may still hold that run,
  // which Setup first tears down.
  bool clear_stale_runs = false;
  // Why the job resumes from spec.ckpt_path ("after the coordinator restarted"), when the
  // coordinator chose that checkpoint rather than the user: said if it cannot be loaded.
  std::string resume_why;
  // Deadline of Setup (the group forms within it) and of each step RPC.
  absl::Duration setup_timeout = absl::Minutes(5);
  absl::Duration step_timeout = absl::Minutes(30);
  // Which of `workers` are stopping (DRAINING); asked before each optimizer step. Null: none.
  std::function<std::vector<std::string>()> draining_workers;
  // When the job was submitted (placement and first-step latency count from it); unset: now.
  absl::Time submitted = absl::InfinitePast();
};

class Trainer final : public TrainerControl, public JobRun {
 public:
  Trainer(TrainerOptions options, TrainerReporter* reporter);

  // OK when the job succeeded; CANCELLED after Cancel; otherwise the failure, naming the
  // worker and rank where it happened. The outcome is final when Run returns; the workers are
  // still the job's until Teardown.
  absl::Status Run() override;
  // Tears the job down on every worker (RunWorkers::Teardown).
  void Teardown() override { workers_.Teardown(); }
  // Workers a call could not reach (UNAVAILABLE): likely dead, not to be placed blindly again.
  std::vector<std::string> unreachable_workers() const override { return workers_.unreachable(); }
  // After Teardown: the unreachable workers, those whose teardown failed (stopped, hung) and
  // the drained ones.
  std::vector<std::string> lost_workers() const override;
  // Workers that were stopping, let go after a checkpoint (Run then returned UNAVAILABLE);
  // they are also in lost_workers.
  const std::vector<std::string>& drained_workers() const override { return drained_; }
  // Stops Run: running RPCs are cancelled (each worker stops before its next batch).
  void Cancel() override { workers_.Cancel(); }
  // Fails the calls under way and every later one, naming the worker (RunWorkers::MarkLost).
  void WorkerLost(const std::string& worker, const std::string& why) override {
    workers_.MarkLost(worker, why);
  }

  // TrainerControl, for the callbacks.
  int64_t global_step() const override { return global_step_; }
  int64_t epoch() const override { return progress_.epoch(); }
  int world_size() const override { return world_; }
  absl::Status SaveCheckpoint(const Save& save) override;
  void SetBestCheckpoint(const std::string& name) override;
  absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) override;
  void Log(const std::string& line) override;
  void ReportPredictions(const std::string& path) override;

 private:
  absl::Status Setup();
  // Loads spec.ckpt_path (or, when it is unreadable, the newest other checkpoint beside it);
  // sets where training resumes.
  absl::Status Resume(int64_t* start_epoch, int64_t* start_batch);
  // Every worker loads `path`; `loaded` (optional) receives their answers.
  absl::Status LoadCheckpoint(const std::string& path,
                              std::vector<v1::LoadCheckpointResponse>* loaded);
  // Before the test after fit: the weights trainer.test_ckpt_path names.
  absl::Status LoadTestWeights();
  absl::Status TrainEpoch(int64_t epoch, int64_t start_batch, bool* stop);
  // Runs validation (or test) over the split: sample-weighted means overall and per rank.
  absl::Status Evaluate(const std::string& split, int64_t limit_samples, bool test,
                        ValidationMetrics* metrics);
  absl::Status Validate(bool* stop);
  // Evaluate, then reports the metrics and logs them (validation during fit and the stages).
  absl::Status EvaluateAndReport(const std::string& split, bool test, ValidationMetrics* metrics);
  // One evaluation request per worker: each rank's unpadded shard of `split` in batches (at
  // most limit_batches, 0: all); `shards` (optional) receives each rank's batches' indices.
  void EvalRequests(const std::string& split, int64_t limit_samples, int64_t limit_batches,
                    std::vector<v1::StepRequest>* requests,
                    std::vector<std::vector<std::vector<int64_t>>>* shards) const;
  // predict_step over the test split, handed to the callbacks as per-sample rows.
  absl::Status Predict();
  // Checkpoints and ends the run so that `names` (stopping) can leave; see drained_workers.
  absl::Status LetDrainingWorkersGo(std::vector<std::string> names);
  void Report();
  // A file the job keeps, written now at this step: the fields every kind shares.
  v1::JobFile NewJobFile(const std::string& name, const std::string& kind) const;
  // The job log's per-rank accounting of training time.
  void LogRankAccounting();
  // How a spec names the checkpoint `name` of this job.
  std::string CheckpointReference(const std::string& name) const;

  TrainerOptions options_;
  TrainerReporter* reporter_;
  RunWorkers workers_;
  std::vector<std::unique_ptr<TrainerCallback>> callbacks_;
  int world_ = 0;
  std::map<std::string, int64_t> split_sizes_;
  std::vector<std::string> drained_;

  v1::JobProgress progress_;
  int64_t global_step_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t total_steps_ = 0;
  int64_t samples_done_ = 0;
  absl::Time fit_start_;
  PhaseClock phases_;
  StepCallSizer call_sizer_;  // batches per training step RPC
  bool first_step_seen_ = false;
  // Per rank: seconds in training steps, and of those, waiting for the others' gradients.
  std::map<int, std::pair<double, double>> rank_seconds_;
  double last_loss_ = 0;
  std::string last_checkpoint_;
  std::string best_checkpoint_;
};

}  // namespace dtrain

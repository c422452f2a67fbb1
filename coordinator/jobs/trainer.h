// The Trainer: one run of a job on its WorkerGroup, as Lightning's Trainer: it sets the group up
// (the ranks form the job's group), restores ckpt_path, then runs the stage's loops — FitLoop
// (with validation and the test after it), EvaluationLoop (validate, test) or PredictionLoop —
// over one TrainingState. What happens at the loops' boundaries belongs to callbacks
// (trainer_callback.h): logging, progress and the ETA, per-rank timing, the learning rate,
// checkpoints, early stopping and predictions. The trainer knows no wire format: the group
// does (grpc_worker_group.h in production, a fake in tests). Time comes from an injected clock.
//
// Thread-safety: Run on one thread; Cancel and WorkerLost from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/jobs/job_run.h"
#include "coordinator/jobs/trainer_callback.h"
#include "coordinator/jobs/trainer_reporter.h"
#include "coordinator/jobs/training_state.h"
#include "coordinator/jobs/worker_group.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/workers.pb.h"

namespace dtrain {

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
  Clock clock = absl::Now;
};

class Trainer final : public TrainerControl, public JobRun {
 public:
  Trainer(TrainerOptions options, TrainerReporter* reporter, std::unique_ptr<WorkerGroup> workers);

  // OK when the job succeeded; CANCELLED after Cancel; otherwise the failure, naming the
  // worker and rank where it happened. The outcome is final when Run returns; the workers are
  // still the job's until Teardown.
  absl::Status Run() override;
  // Tears the job down on every worker, bounded in time.
  void Teardown() override { workers_->Teardown(); }
  // Workers a call could not reach (UNAVAILABLE): likely dead, not to be placed blindly again.
  std::vector<std::string> unreachable_workers() const override { return workers_->unreachable(); }
  // After Teardown: the unreachable workers, those whose teardown failed (stopped, hung) and
  // the drained ones.
  std::vector<std::string> lost_workers() const override;
  // Workers that were stopping, let go after a checkpoint (Run then returned UNAVAILABLE);
  // they are also in lost_workers.
  const std::vector<std::string>& drained_workers() const override { return drained_; }
  // Stops Run: running calls are cancelled (each worker stops before its next batch).
  void Cancel() override { workers_->Cancel(); }
  // Fails the calls under way and every later one, naming the worker.
  void WorkerLost(const std::string& worker, const std::string& why) override {
    workers_->MarkLost(worker, why);
  }

  // TrainerControl, for the callbacks.
  const TrainingState& state() const override { return state_; }
  const v1::JobSpec& spec() const override { return options_.spec; }
  absl::Time Now() const override { return options_.clock(); }
  absl::Status SaveCheckpoint(const Save& save) override;
  void SetBestCheckpoint(const std::string& name) override;
  absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) override {
    return workers_->AnyRankDecides(by_rank);
  }
  // Early stopping's request; held back (and said once) until trainer.min_epochs and
  // min_steps are reached, as Lightning's fit loop does.
  void RequestStop() override;
  void Log(const std::string& line) override { FlushedReporter().Log(line); }
  void LogMetric(const std::string& name, double value) override {
    LogMetricAt(name, value, state_.global_step);
  }
  void LogMetricAt(const std::string& name, double value, int64_t step) override;
  void ReportProgress(const v1::JobProgress& progress) override {
    FlushedReporter().Progress(progress);
  }
  void ReportPredictions(const std::string& path) override;

 private:
  // The callbacks in the order they run (built once, by the constructor).
  std::vector<std::unique_ptr<TrainerCallback>> Callbacks();
  // The reporter, once the metric points logged so far have reached it: points are held until
  // their callback round ends (one store transaction for a call's points), and any other
  // report first lets them through, so the record sees everything in the order it happened.
  TrainerReporter& FlushedReporter();
  void FlushMetrics();

  // The stage's loops, after setup and restore.
  absl::Status RunStages();
  absl::Status Setup();
  // Loads spec.ckpt_path (or, when it is unreadable, the newest other checkpoint beside it);
  // sets where training resumes.
  absl::Status Resume(int64_t* start_epoch, int64_t* start_batch);
  // Every rank loads `path` (a spec's reference, resolved here).
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path);
  // Before the test after fit: the weights trainer.test_ckpt_path names.
  absl::Status LoadTestWeights();
  // A file the job keeps, written now at this step: the fields every kind shares.
  v1::JobFile NewJobFile(const std::string& name, const std::string& kind) const;
  // How a spec names the checkpoint `name` of this job.
  std::string CheckpointReference(const std::string& name) const;

  TrainerOptions options_;
  TrainerReporter* const reporter_;
  std::vector<v1::MetricPoint> pending_metrics_;  // see FlushedReporter()
  const std::unique_ptr<WorkerGroup> workers_;
  TrainingState state_;
  CallbackList callbacks_;
  std::string spec_json_;  // kept in every checkpoint's metadata
  std::vector<std::string> drained_;
  bool said_min_ = false;     // the job log said early stopping waits for min_epochs / min_steps
  std::string optimization_;  // what the workers said the job trains with
};

}  // namespace dtrain

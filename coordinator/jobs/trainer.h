// The Trainer: runs one job's fit / validate / test on the workers placed for it, through their
// step RPCs (as Lightning's Trainer runs its loops on an Accelerator). It sets up every worker
// (they form the job's group), shards the data with a DistributedSampler, sends each worker
// several batches per step RPC, validates at val_check_interval, stops early through the
// ranks' reduce_boolean_decision, keeps the top-k checkpoints, tests, and tears down. It never
// waits without a deadline: every RPC has one, and one failed worker cancels the others' calls
// after a grace period.
//
// Thread-safety: Run on one thread; Cancel from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/parallel_calls.h"
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
  virtual void Checkpoint(const std::string& last, const std::string& best) = 0;
  virtual void Predictions(const std::string& path) = 0;
};

// After one worker's call fails, how long the others get to report their own error before
// their calls are cancelled (they usually fail within milliseconds: the group fails them all).
inline constexpr absl::Duration kFailureGrace = absl::Seconds(2);
inline constexpr absl::Duration kTeardownTimeout = absl::Seconds(10);

struct TrainerOptions {
  std::string job_id;
  v1::JobSpec spec;                     // normalized
  std::vector<v1::WorkerInfo> workers;  // placed for this job, in placement order
  std::string coordinator;              // the address workers reach the coordinator at
  std::string checkpoint_dir;           // where checkpoints go (rank 0's file system)
  std::string output_dir;               // the job's directory (predictions)
  std::string group;                    // the job's group id; "": job_id
  std::string job_token;                // the workers' bearer token in the job's group
  // The job ran before under a coordinator that stopped: its workers may still hold that run,
  // which Setup first tears down.
  bool clear_stale_runs = false;
  // Why the job resumes from spec.resume_from ("after the coordinator restarted"), when the
  // coordinator chose that checkpoint rather than the user: said if it cannot be loaded.
  std::string resume_why;
  // Deadline of Setup (the group forms within it) and of each step RPC.
  absl::Duration setup_timeout = absl::Minutes(5);
  absl::Duration step_timeout = absl::Minutes(30);
  // Which of `workers` are stopping (DRAINING); asked before each optimizer step. Null: none.
  std::function<std::vector<std::string>()> draining_workers;
};

class Trainer {
 public:
  Trainer(TrainerOptions options, TrainerReporter* reporter);

  // OK when the job succeeded; CANCELLED after Cancel; otherwise the failure, naming the
  // worker and rank where it happened. The outcome is final when Run returns; the workers are
  // still the job's until Teardown.
  absl::Status Run();
  // Tears the job down on every worker, bounded by kTeardownTimeout: a stopped or unreachable
  // worker does not hold the others (or the job's outcome) hostage.
  void Teardown();
  // Workers a call could not reach (UNAVAILABLE): likely dead, not to be placed blindly again.
  std::vector<std::string> unreachable_workers() const;
  // After Teardown: the unreachable workers and those whose teardown failed (stopped, hung).
  std::vector<std::string> lost_workers() const;
  // Workers that were stopping, let go after a checkpoint (Run then returned UNAVAILABLE);
  // they are also in lost_workers.
  const std::vector<std::string>& drained_workers() const { return drained_; }
  // Stops Run: running RPCs are cancelled (each worker stops before its next batch).
  void Cancel();

 private:
  struct Placement {
    int worker = 0;  // index into options_.workers
    int local = 0;   // local rank within the worker
  };
  struct EarlyStopState {
    double best = 0;
    bool has_best = false;
    int wait = 0;
  };
  // One RPC per worker at once; the first failure, naming worker and ranks, or OK.
  absl::Status OnEveryWorker(const std::string& what,
                             const std::function<grpc::Status(int, grpc::ClientContext*)>& call,
                             absl::Duration timeout);
  absl::Status Setup();
  absl::Status TrainEpoch(int64_t epoch, int64_t start_batch, bool* stop);
  // Runs validation (or test) over the split; fills per-rank and overall metric means.
  absl::Status Evaluate(const std::string& split, int64_t limit_samples, bool test,
                        std::map<std::string, double>* overall,
                        std::vector<std::map<std::string, double>>* per_rank);
  absl::Status ValidateAndMaybeStop(int64_t epoch, bool* stop);
  // Evaluate, then reports the metrics and logs them (validation during fit and the stages).
  absl::Status EvaluateAndReport(const std::string& split, bool test,
                                 std::map<std::string, double>* overall,
                                 std::vector<std::map<std::string, double>>* per_rank);
  // One evaluation request per worker: each rank's unpadded shard of `split` in batches (at
  // most limit_batches, 0: all); `shards` (optional) receives each rank's batches' indices.
  void EvalRequests(const std::string& split, int64_t limit_samples, int64_t limit_batches,
                    std::vector<v1::StepRequest>* requests,
                    std::vector<std::vector<std::vector<int64_t>>>* shards) const;
  // predict_step over the test split; writes <output_dir>/predictions.csv.
  absl::Status Predict();
  absl::Status SaveCheckpoint(const std::string& path, int64_t epoch);
  // Checkpoints and ends the run so that `names` (stopping) can leave; see drained_workers.
  absl::Status LetDrainingWorkersGo(std::vector<std::string> names, int64_t epoch);

  std::string DescribeWorker(int worker) const;
  void Report();

  TrainerOptions options_;
  TrainerReporter* reporter_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  std::vector<std::vector<int>> ranks_of_worker_;  // global ranks, by local rank
  std::vector<Placement> placement_;               // by global rank
  int world_ = 0;
  std::map<std::string, int64_t> split_sizes_;
  ParallelCalls calls_;
  // Indices of workers whose calls ended UNAVAILABLE (the trainer's thread only).
  std::set<int> unreachable_;
  std::set<int> teardown_failed_;
  std::vector<std::string> drained_;
  // Notes which of `results` (one per worker) could not reach their worker.
  void NoteUnreachable(const std::vector<grpc::Status>& results);
  // The other *.ckpt files in `path`'s directory, newest first.
  static std::vector<std::string> OtherCheckpoints(const std::string& path);
  std::atomic<bool> cancelled_{false};

  v1::JobProgress progress_;
  int64_t global_step_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t total_steps_ = 0;
  int64_t samples_done_ = 0;
  absl::Time fit_start_;
  double last_loss_ = 0;
  std::vector<EarlyStopState> early_stop_;
  // Checkpoints kept by monitor value: (value, path), best first.
  std::vector<std::pair<double, std::string>> top_k_;
  std::string last_checkpoint_;
};

}  // namespace dtrain

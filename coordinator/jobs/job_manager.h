// JobManager: the coordinator's jobs. Queues submitted jobs (first in, first out), places each
// on enough idle registered workers when they are there, runs its Trainer on a thread of its
// own, and keeps every job's status, log, metrics (memory, metrics.csv and TensorBoard events
// under <state_dir>/jobs/<id>/) and watchers. States: QUEUED -> RUNNING -> SUCCEEDED | FAILED
// (with the reason) | CANCELLED.
//
// With a database (Restore), every job's spec, status and metric points are also kept in SQLite
// (job_store.h). A restarted coordinator lists them as before; jobs that were queued are queued
// again, and jobs that were running are queued to resume from their last checkpoint (or from the
// start when they had none). Stopping the coordinator (Shutdown) interrupts running jobs without
// recording them as cancelled, so an orderly restart resumes them too.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "coordinator/artifacts/artifact_store.h"
#include "coordinator/auth/access_control.h"
#include "coordinator/jobs/job_record.h"
#include "coordinator/jobs/job_run.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/trainer.h"
#include "coordinator/jobs/worker_registry.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/worker.grpc.pb.h"

namespace dtrain {

struct JobManagerOptions {
  std::string state_dir;  // the coordinator's (CoordinatorOptions::state_dir)
  std::string host;       // for event file names
  absl::Duration setup_timeout = absl::Minutes(5);
  absl::Duration step_timeout = absl::Minutes(30);
  // Makes each run of a job; null: a Trainer on the placed workers (tests pass a stand-in).
  JobRunFactory make_run;
};

// How many jobs there are in each state, and what the running ones train together.
struct JobCounts {
  std::map<v1::JobState, int64_t> by_state;
  double running_samples_per_second = 0;
};

class JobManager {
 public:
  using Watcher = JobWatcher;

  // `access` issues each job's token (null: no tokens).
  JobManager(JobManagerOptions options, WorkerRegistry* workers, AccessControl* access = nullptr);
  // Cancels running jobs and waits for their threads.
  ~JobManager();

  // INVALID_ARGUMENT naming the spec's field. validate_only: nothing is queued.
  absl::StatusOr<v1::JobStatus> Submit(v1::JobSpec spec, bool validate_only);
  // Checks `spec`, reserves one idle worker and has it run Worker.DryRun (model and data
  // loaded, one training_step and one validation_step); `done` gets its report, or the error
  // naming the worker, from gRPC's callback thread. Nothing is queued. FAILED_PRECONDITION
  // when no worker is idle. Never blocks.
  void DryRun(v1::JobSpec spec, std::function<void(absl::StatusOr<v1::DryRunResponse>)> done);
  absl::StatusOr<v1::JobStatus> Get(const std::string& id, bool with_spec) const;
  std::vector<v1::JobStatus> List() const;
  // Up to `count` jobs from position `first` in submission order (newest_first: from the
  // newest back), copying only those; `total` gets how many jobs there are.
  std::vector<v1::JobStatus> List(size_t first, size_t count, bool newest_first,
                                  size_t* total) const;
  // The statuses of the jobs `want` picks by id and state, in submission order, copying only
  // those: the others cost a look at their state. For callers that ask again and again about a
  // history of thousands of ended jobs (the dashboard's event streams). `want` is called without
  // the manager's lock, one job at a time.
  std::vector<v1::JobStatus> ListWhere(
      const std::function<bool(const std::string& id, v1::JobState state)>& want) const;
  // Every job counted by state, copying the status of the running ones only.
  JobCounts Count() const;
  // FAILED_PRECONDITION when the job already ended.
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& id);
  absl::StatusOr<std::vector<std::string>> Logs(const std::string& id, int64_t from_line,
                                                int64_t* next_line) const;
  absl::StatusOr<std::vector<v1::MetricPoint>> Metrics(const std::string& id) const;
  // Calls `watcher` with the status now and after every change (from the job's thread, one
  // call at a time), the last call with a terminal state. Returns a handle for Unwatch.
  absl::StatusOr<int64_t> Watch(const std::string& id, Watcher watcher);
  void Unwatch(const std::string& id, int64_t handle);

  // Opens the job database at `path` (created if missing), loads its jobs and requeues the
  // unfinished ones; from then on every change is written there. Call once, before serving.
  absl::Status Restore(const std::string& path);

  // Where jobs keep their files (checkpoints, predictions) and whose unused files Delete and
  // top-k eviction free. Null: checkpoints go only to a shared checkpoint.dirpath. Set once,
  // before Restore.
  void SetArtifactStore(ArtifactStore* artifacts);

  // Forgets an ended job (status, log, metrics, directory) and frees the stored files no other
  // job names. FAILED_PRECONDITION while it is queued or running; NOT_FOUND for an unknown id.
  absl::StatusOr<v1::DeleteJobResponse> Delete(const std::string& id);

  // "job:<id>/<name>" as a worker loads it: the file's artifact reference (or its worker path
  // when it is on a shared dirpath). Any other reference comes back as it is. NOT_FOUND naming
  // the job or the file (and the files it has) otherwise.
  absl::StatusOr<std::string> ResolveFile(const std::string& reference) const;

  // Whether a job token of `group` may read `digest`: a file that group's job names (its spec's
  // uploads, the shards its uploaded shard lists name, its checkpoints and predictions).
  bool GroupMayRead(const std::string& group, const std::string& digest) const;

  // The address workers reach the coordinator at (for their groups); set once serving.
  void SetCoordinatorAddress(const std::string& address);

  // Places queued jobs on idle workers; the coordinator's monitor thread calls it each tick.
  void Schedule();
  // Whether Schedule has work: a job waits to be placed, or a finished job's thread to be
  // joined.
  bool Waiting() const;
  // Tells each running job which of its workers the registry holds LOST (WorkerRegistry::Tick),
  // so a call waiting on a silent worker fails at the heartbeat timeout, whatever the call.
  void WorkersLost(const std::vector<WorkerRegistry::LostWorker>& lost);
  // Cancels everything (the coordinator is stopping).
  void Shutdown();

 private:
  std::shared_ptr<JobRecord> Find(const std::string& id) const;
  // The job a request's `id` names: INVALID_ARGUMENT for an empty id or one past any job's
  // length (not echoed: an error's message travels in a header), NOT_FOUND for an unknown one.
  absl::StatusOr<std::shared_ptr<JobRecord>> FindRequested(const std::string& id) const;
  void Start(const std::shared_ptr<JobRecord>& job, std::vector<v1::WorkerInfo> workers);
  // The job's thread: runs its Trainer, re-forming an elastic job that lost workers, then
  // frees its workers.
  void RunJob(const std::shared_ptr<JobRecord>& job, TrainerOptions options);
  static void PublishOutcome(JobRecord& job, const absl::Status& status);
  // Gives the record its files-dropped callback (FreeUnused).
  void Track(const std::shared_ptr<JobRecord>& job);
  // Every digest some job names (specs and kept files).
  std::set<std::string> NamedDigests() const;
  // Deletes those of `digests` nobody names any more; their bytes.
  int64_t FreeUnused(const std::vector<std::string>& digests, int* removed);

  const JobManagerOptions options_;
  WorkerRegistry* const workers_;
  AccessControl* const access_;
  std::unique_ptr<JobStore> store_;     // set by Restore, before any job exists
  ArtifactStore* artifacts_ = nullptr;  // set before any job exists
  // One freeing at a time: a digest checked unused is not named by a job submitted meanwhile
  // (Submit takes it too).
  mutable absl::Mutex free_mu_;
  // The shard digests each uploaded shard list names, by the list's digest (content-addressed,
  // so a parse holds for good); a few lists at most.
  std::shared_ptr<const std::set<std::string>> UploadedShards(const std::string& list) const;
  mutable absl::Mutex shard_lists_load_mu_;  // taken before shard_lists_mu_
  mutable absl::Mutex shard_lists_mu_;
  mutable std::map<std::string, std::shared_ptr<const std::set<std::string>>> shard_lists_
      ABSL_GUARDED_BY(shard_lists_mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<JobRecord>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // submission order
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> name_counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::thread> threads_ ABSL_GUARDED_BY(mu_);  // running trainers
  std::vector<std::string> finished_ ABSL_GUARDED_BY(mu_);           // threads to join
  // Jobs whose run ended to let stopping workers go, too few workers being left: once their
  // thread is joined they return to the head of the queue and resume from their checkpoint.
  std::vector<std::string> requeued_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string coordinator_address_ ABSL_GUARDED_BY(mu_);
  // Dry runs in flight (their calls, to cancel at shutdown, which waits for their callbacks).
  int64_t dry_run_counter_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<grpc::ClientContext*> dry_runs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain

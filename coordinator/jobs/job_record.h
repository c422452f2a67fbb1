// JobRecord: one job as the coordinator keeps it: its spec, status, log, metric points (memory,
// metrics.csv and TensorBoard events under <state_dir>/jobs/<id>/, and the SQLite store when
// there is one) and watchers. The Trainer reports into it (TrainerReporter); the job manager
// owns it and decides when it runs.
//
// Thread-safety: every method may be called from any thread; watchers are called one at a time,
// outside the record's lock.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/jobs/job_run.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/metrics_log.h"
#include "coordinator/jobs/trainer_reporter.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/workers.pb.h"

namespace dtrain {

using JobWatcher = std::function<void(const v1::JobStatus& status)>;

class JobRecord : public TrainerReporter {
 public:
  JobRecord(std::string id, v1::JobSpec spec, std::string dir);

  // A job read back from `store`. A finished one keeps its log and metric points on disk only;
  // an unfinished one gets them back in memory, since it goes on adding to them.
  JobRecord(JobStore::StoredJob stored, std::string dir, JobStore* store);

  const std::string& id() const { return status_id_; }
  const std::string& dir() const { return dir_; }

  // From now on every change is written to `store` (null: none). The first write of a new job
  // inserts it.
  void SetStore(JobStore* store, bool insert);
  // A job that was running when the coordinator stopped, or whose workers were drained, waits
  // to run again: from `checkpoint` when there is one. `why` ("after ...") goes into the
  // reason if that checkpoint cannot be loaded.
  void PrepareResume(const std::string& checkpoint, const std::string& why);
  // 0 for the job's first run, then 1, 2, ... for each re-formed or resumed run (its group's
  // suffix: a run's group is never an earlier run's).
  int NextRun();
  bool resuming() const;
  std::string ckpt_path() const;
  std::string resume_why() const;
  std::string checkpoint() const;

  // The spec is attached only when asked: watchers get a status at every step, without it.
  v1::JobStatus Status(bool with_spec) const;
  const v1::JobSpec& spec() const { return spec_; }

  void Log(const std::string& line) override { LogAt(LogLevel::kInfo, line); }
  // To the job's log (dtrain logs) and, with the job's id, to the coordinator's.
  void LogAt(LogLevel level, const std::string& line);

  void Progress(const v1::JobProgress& progress) override;

  // One store transaction, one flush of the job's metric files and one watcher notice for
  // all of `points`.
  void Metrics(const std::vector<v1::MetricPoint>& points) override;

  void Checkpoint(const std::string& last, const std::string& best) override;

  // Replaces the file of the same name; forgets `dropped`. Digests the job no longer names are
  // handed to the files-dropped callback (outside the lock), which frees them if nothing else
  // names them either.
  void KeepFile(const v1::JobFile& file, const std::vector<std::string>& dropped) override;
  std::vector<v1::JobFile> Files() const;
  void SetFilesDropped(std::function<void(std::vector<std::string> digests)> callback);

  void Predictions(const std::string& path) override;
  // hparams.yaml again, with the model's values under hyper_parameters.
  void HyperParameters(const std::vector<std::pair<std::string, std::string>>& values) override;

  // Opens the job's files; a failure is the job's (FAILED), not the coordinator's.
  absl::Status OpenFiles(const std::string& host);

  void SetRunning(const std::vector<v1::WorkerInfo>& workers);

  // Once a job is over and its thread done: its files are closed, and its log lines (and its
  // metric points, when the store has them) leave memory for the disk, so a long-lived
  // coordinator's memory and open files do not grow with every job it ran.
  void Release();

  // The workers of a re-formed run, in placement order.
  void SetWorkers(const std::vector<v1::WorkerInfo>& workers);

  // Ends the job once; later calls keep the first ending.
  void Finish(v1::JobState state, const std::string& reason);

  bool terminal() const;
  v1::JobState state() const;
  // The run succeeded and the job is releasing its workers, to be published SUCCEEDED once they
  // are free: it has ended for a cancel, a delete and a coordinator's shutdown. The database
  // records SUCCEEDED at once, so that a coordinator killed during the release does not run the
  // job again after a restart; readers of this coordinator see RUNNING until the publish.
  void MarkSucceeding();
  bool succeeding() const;

  std::vector<std::string> Lines(int64_t from, int64_t* next) const;
  std::vector<v1::MetricPoint> Points() const;

  int64_t AddWatcher(JobWatcher watcher);
  void RemoveWatcher(int64_t handle);

  // Cancel: a running trainer is asked to stop; whoever holds it finishes the job.
  void RequestCancel();
  // RequestCancel, unless the job has ended or is succeeding (false then): one check and act, so
  // a run that succeeds meanwhile is not told it was cancelled.
  bool RequestCancelUnlessEnded();
  // A coordinator's shutdown, unless the job has ended or is succeeding (false then): the store
  // is let go first, so the database keeps the job queued or running for the next coordinator,
  // then the run is asked to stop.
  bool Interrupt();
  bool cancel_requested() const;
  // The registry holds `worker` LOST (`why`): the running run, if any, stops calling it.
  void WorkerLost(const std::string& worker, const std::string& why);
  void SetRun(JobRun* run);

 private:
  std::vector<std::string> ReadLogFile() const;

  // Writes the status to the store: always when `force` (state, checkpoints), else at most once
  // a second (progress and metric summaries change at every step).
  void PersistLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed write costs durability, not the job: say so on the coordinator's stderr, once.
  void Report(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Notify();

  const std::string dir_;
  const v1::JobSpec spec_;  // immutable once submitted
  std::string status_id_;   // status_.id(), set once at construction: read without the lock
  mutable absl::Mutex mu_;
  v1::JobStatus status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::MetricPoint> points_ ABSL_GUARDED_BY(mu_);
  // The job's metrics files, under their own lock (taken before mu_ when both are): writing
  // them may rewrite a file, which no status call should wait for.
  absl::Mutex metrics_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<MetricsLog> metrics_ ABSL_GUARDED_BY(metrics_mu_);
  std::ofstream log_file_ ABSL_GUARDED_BY(mu_);
  JobRun* run_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool succeeding_ ABSL_GUARDED_BY(mu_) = false;
  const bool restored_ = false;
  JobStore* store_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The store Interrupt let go of: a run that succeeds all the same stores its success there.
  JobStore* interrupted_store_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time last_persist_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool store_error_reported_ ABSL_GUARDED_BY(mu_) = false;
  std::string ckpt_path_ ABSL_GUARDED_BY(mu_);
  std::string resume_why_ ABSL_GUARDED_BY(mu_);
  bool lines_on_disk_ ABSL_GUARDED_BY(mu_) = false;    // lines_ released: read job.log
  bool points_in_store_ ABSL_GUARDED_BY(mu_) = false;  // points_ released: ask store_
  bool resuming_ ABSL_GUARDED_BY(mu_) = false;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(std::vector<std::string>)> files_dropped_ ABSL_GUARDED_BY(mu_);
  // Watchers are called outside mu_ (they take their own locks) but one at a time.
  absl::Mutex watch_mu_;
  std::map<int64_t, JobWatcher> watchers_ ABSL_GUARDED_BY(watch_mu_);
  int64_t next_watcher_ ABSL_GUARDED_BY(watch_mu_) = 0;
};

}  // namespace dtrain

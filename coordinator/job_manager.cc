#include "coordinator/job_manager.h"

#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/metrics_log.h"
#include "coordinator/trainer.h"

namespace dtrain {

// One job: its status, log, metrics and watchers; the Trainer reports into it.
class JobManager::Job : public TrainerReporter {
 public:
  Job(std::string id, v1::JobSpec spec, std::string dir)
      : dir_(std::move(dir)), spec_(std::move(spec)) {
    status_id_ = id;
    status_.set_id(std::move(id));
    status_.set_name(spec_.name());
    status_.set_state(v1::QUEUED);
    status_.set_submitted_unix_ms(absl::ToUnixMillis(absl::Now()));
    status_.set_log_dir(dir_);
    status_.mutable_progress()->set_phase("waiting");
  }

  // A job read back from `store`. A finished one keeps its log and metric points on disk only;
  // an unfinished one gets them back in memory, since it goes on adding to them.
  Job(JobStore::StoredJob stored, std::string dir, JobStore* store)
      : dir_(std::move(dir)), spec_(std::move(stored.spec)), restored_(true) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(stored.status);
    status_id_ = status_.id();
    store_ = store;
    if (IsTerminal(status_.state())) {
      lines_on_disk_ = true;
      points_in_store_ = true;
      return;
    }
    lines_ = ReadLogFile();
    absl::StatusOr<std::vector<v1::MetricPoint>> points = store_->Points(status_.id());
    Report(points.status());
    if (points.ok()) points_ = std::move(*points);
  }

  const std::string& id() const { return status_.id(); }
  const std::string& dir() const { return dir_; }

  // From now on every change is written to `store` (null: none). The first write of a new job
  // inserts it.
  void SetStore(JobStore* store, bool insert) {
    absl::MutexLock lock(&mu_);
    store_ = store;
    if (store_ == nullptr) return;
    if (insert) {
      Report(store_->Insert(spec_, status_));
    } else {
      PersistLocked(/*force=*/true);
    }
  }
  // A job that was running when the coordinator stopped, or whose workers were drained, waits
  // to run again: from `checkpoint` when there is one. `why` ("after ...") goes into the
  // reason if that checkpoint cannot be loaded.
  void PrepareResume(const std::string& checkpoint, const std::string& why) {
    {
      absl::MutexLock lock(&mu_);
      resume_from_ = checkpoint;
      resume_why_ = why;
      status_.set_state(v1::QUEUED);
      status_.clear_workers();
      status_.set_started_unix_ms(0);
      status_.mutable_progress()->set_phase("waiting to resume");
      resuming_ = true;
      PersistLocked(/*force=*/true);
    }
    Notify();
  }
  // 0 for the job's first run, then 1, 2, ... for each re-formed or resumed run (its group's
  // suffix: a run's group is never an earlier run's).
  int NextRun() {
    absl::MutexLock lock(&mu_);
    return runs_++;
  }
  bool resuming() const {
    absl::MutexLock lock(&mu_);
    return resuming_;
  }
  std::string resume_from() const {
    absl::MutexLock lock(&mu_);
    return resume_from_;
  }
  std::string resume_why() const {
    absl::MutexLock lock(&mu_);
    return resume_why_;
  }
  std::string checkpoint() const {
    absl::MutexLock lock(&mu_);
    return status_.checkpoint();
  }

  // The spec is attached only when asked: watchers get a status at every step, without it.
  v1::JobStatus Status(bool with_spec) const {
    absl::MutexLock lock(&mu_);
    v1::JobStatus copy = status_;
    if (with_spec) *copy.mutable_spec() = spec_;
    return copy;
  }
  const v1::JobSpec& spec() const { return spec_; }

  void Log(const std::string& line) override { LogAt(LogLevel::kInfo, line); }
  // To the job's log (dtrain logs) and, with the job's id, to the coordinator's.
  void LogAt(LogLevel level, const std::string& line) {
    ::dtrain::Log(level, line, {{"job", status_id_}});
    const std::string stamped =
        absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone()),
                     " ", line);
    {
      absl::MutexLock lock(&mu_);
      if (lines_on_disk_) {
        std::ofstream(dir_ + "/job.log", std::ios::app) << stamped << "\n";
      } else {
        lines_.push_back(stamped);
        if (log_file_.is_open()) log_file_ << stamped << "\n" << std::flush;
      }
    }
    Notify();
  }

  void Progress(const v1::JobProgress& progress) override {
    {
      absl::MutexLock lock(&mu_);
      *status_.mutable_progress() = progress;
      PersistLocked(/*force=*/false);
    }
    Notify();
  }

  void Metric(const std::string& name, double value, int64_t step, int64_t epoch) override {
    {
      absl::MutexLock lock(&mu_);
      const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
      v1::MetricPoint p;
      p.set_name(name);
      p.set_value(value);
      p.set_step(step);
      p.set_epoch(epoch);
      p.set_wall_unix_ms(static_cast<int64_t>(now * 1000));
      (*status_.mutable_metrics())[name] = value;
      if (store_ != nullptr) Report(store_->AddMetric(status_.id(), p));
      if (!points_in_store_) points_.push_back(std::move(p));
      PersistLocked(/*force=*/false);
      if (metrics_ != nullptr) {
        metrics_->Add(name, value, step, epoch, now);
        metrics_->Flush();
      }
    }
    Notify();
  }

  void Checkpoint(const std::string& last, const std::string& best) override {
    {
      absl::MutexLock lock(&mu_);
      status_.set_checkpoint(last);
      status_.set_best_checkpoint(best);
      PersistLocked(/*force=*/true);
    }
    Notify();
  }

  void Predictions(const std::string& path) override {
    {
      absl::MutexLock lock(&mu_);
      status_.set_predictions(path);
      PersistLocked(/*force=*/true);
    }
    Notify();
  }

  // Opens the job's files; a failure is the job's (FAILED), not the coordinator's.
  absl::Status OpenFiles(const std::string& host) {
    if (absl::Status s = MakeDirectories(dir_ + "/checkpoints"); !s.ok()) return s;
    // A restored job goes on writing its files where they ended.
    absl::StatusOr<std::unique_ptr<MetricsLog>> metrics = MetricsLog::Create(dir_, host, restored_);
    if (!metrics.ok()) return metrics.status();
    absl::MutexLock lock(&mu_);
    metrics_ = std::move(*metrics);
    log_file_.open(dir_ + "/job.log", std::ios::app);
    if (!restored_) {
      for (const std::string& line : lines_) log_file_ << line << "\n";
    }
    log_file_.flush();
    return absl::OkStatus();
  }

  void SetRunning(const std::vector<v1::WorkerInfo>& workers) {
    {
      absl::MutexLock lock(&mu_);
      status_.set_state(v1::RUNNING);
      status_.set_started_unix_ms(absl::ToUnixMillis(absl::Now()));
      for (const v1::WorkerInfo& w : workers) status_.add_workers(w.name());
      PersistLocked(/*force=*/true);
    }
    Notify();
  }

  // Once a job is over and its thread done: its files are closed, and its log lines (and its
  // metric points, when the store has them) leave memory for the disk, so a long-lived
  // coordinator's memory and open files do not grow with every job it ran.
  void Release() {
    absl::MutexLock lock(&mu_);
    if (!IsTerminal(status_.state())) return;
    metrics_.reset();
    if (log_file_.is_open()) {
      log_file_.close();
      lines_on_disk_ = true;
      std::vector<std::string>().swap(lines_);
    }
    if (store_ != nullptr) {
      points_in_store_ = true;
      std::vector<v1::MetricPoint>().swap(points_);
    }
  }

  // The workers of a re-formed run, in placement order.
  void SetWorkers(const std::vector<v1::WorkerInfo>& workers) {
    {
      absl::MutexLock lock(&mu_);
      status_.clear_workers();
      for (const v1::WorkerInfo& w : workers) status_.add_workers(w.name());
      PersistLocked(/*force=*/true);
    }
    Notify();
  }

  // Ends the job once; later calls keep the first ending.
  void Finish(v1::JobState state, const std::string& reason) {
    {
      absl::MutexLock lock(&mu_);
      if (IsTerminal(status_.state())) return;
      status_.set_state(state);
      status_.set_reason(reason);
      status_.set_finished_unix_ms(absl::ToUnixMillis(absl::Now()));
      if (status_.progress().phase() != "done") status_.mutable_progress()->set_phase("done");
      PersistLocked(/*force=*/true);
    }
    LogAt(state == v1::FAILED ? LogLevel::kWarning : LogLevel::kInfo,
          absl::StrCat("job ", v1::JobState_Name(state), reason.empty() ? "" : ": ", reason));
  }

  bool terminal() const {
    absl::MutexLock lock(&mu_);
    return IsTerminal(status_.state());
  }
  v1::JobState state() const {
    absl::MutexLock lock(&mu_);
    return status_.state();
  }

  std::vector<std::string> Lines(int64_t from, int64_t* next) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> on_disk;
    const std::vector<std::string>& lines = lines_on_disk_ ? (on_disk = ReadLogFile()) : lines_;
    from = std::clamp<int64_t>(from, 0, static_cast<int64_t>(lines.size()));
    *next = static_cast<int64_t>(lines.size());
    return std::vector<std::string>(lines.begin() + from, lines.end());
  }
  std::vector<v1::MetricPoint> Points() const {
    absl::MutexLock lock(&mu_);
    if (!points_in_store_) return points_;
    if (store_ == nullptr) return {};
    absl::StatusOr<std::vector<v1::MetricPoint>> points = store_->Points(status_.id());
    return points.ok() ? std::move(*points) : std::vector<v1::MetricPoint>();
  }

  int64_t AddWatcher(Watcher watcher) {
    absl::MutexLock lock(&watch_mu_);
    const int64_t handle = ++next_watcher_;
    watchers_[handle] = std::move(watcher);
    watchers_[handle](Status(false));
    return handle;
  }
  void RemoveWatcher(int64_t handle) {
    absl::MutexLock lock(&watch_mu_);
    watchers_.erase(handle);
  }

  // Cancel: a running trainer is asked to stop; whoever holds it finishes the job.
  void RequestCancel() {
    absl::MutexLock lock(&mu_);
    cancel_requested_ = true;
    if (trainer_ != nullptr) trainer_->Cancel();
  }
  bool cancel_requested() const {
    absl::MutexLock lock(&mu_);
    return cancel_requested_;
  }
  void SetTrainer(Trainer* trainer) {
    absl::MutexLock lock(&mu_);
    trainer_ = trainer;
    if (trainer_ != nullptr && cancel_requested_) trainer_->Cancel();
  }

 private:
  std::vector<std::string> ReadLogFile() const {
    std::vector<std::string> lines;
    std::ifstream log(dir_ + "/job.log");
    for (std::string line; std::getline(log, line);) lines.push_back(std::move(line));
    return lines;
  }

  // Writes the status to the store: always when `force` (state, checkpoints), else at most once
  // a second (progress and metric summaries change at every step).
  void PersistLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (store_ == nullptr) return;
    const absl::Time now = absl::Now();
    if (!force && now - last_persist_ < absl::Seconds(1)) return;
    last_persist_ = now;
    Report(store_->Update(status_));
  }
  // A failed write costs durability, not the job: say so on the coordinator's stderr, once.
  void Report(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status.ok() || store_error_reported_) return;
    store_error_reported_ = true;
    LogError(absl::StrCat("job ", status_.id(), ": ", status.message(),
                          " (later changes may not survive a restart)"),
             {{"job", status_.id()}});
  }

  void Notify() {
    const v1::JobStatus now = Status(false);
    absl::MutexLock lock(&watch_mu_);
    for (auto& [handle, watcher] : watchers_) watcher(now);
  }

  const std::string dir_;
  const v1::JobSpec spec_;  // immutable once submitted
  std::string status_id_;   // status_.id(), readable without the lock
  mutable absl::Mutex mu_;
  v1::JobStatus status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::MetricPoint> points_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MetricsLog> metrics_ ABSL_GUARDED_BY(mu_);
  std::ofstream log_file_ ABSL_GUARDED_BY(mu_);
  Trainer* trainer_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  const bool restored_ = false;
  JobStore* store_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time last_persist_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool store_error_reported_ ABSL_GUARDED_BY(mu_) = false;
  std::string resume_from_ ABSL_GUARDED_BY(mu_);
  std::string resume_why_ ABSL_GUARDED_BY(mu_);
  bool lines_on_disk_ ABSL_GUARDED_BY(mu_) = false;    // lines_ released: read job.log
  bool points_in_store_ ABSL_GUARDED_BY(mu_) = false;  // points_ released: ask store_
  bool resuming_ ABSL_GUARDED_BY(mu_) = false;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
  // Watchers are called outside mu_ (they take their own locks) but one at a time.
  absl::Mutex watch_mu_;
  std::map<int64_t, Watcher> watchers_ ABSL_GUARDED_BY(watch_mu_);
  int64_t next_watcher_ ABSL_GUARDED_BY(watch_mu_) = 0;
};

JobManager::JobManager(JobManagerOptions options, WorkerRegistry* workers, AccessControl* access)
    : options_(std::move(options)), workers_(workers), access_(access) {}

JobManager::~JobManager() { Shutdown(); }

absl::StatusOr<v1::JobStatus> JobManager::Submit(v1::JobSpec spec, bool validate_only) {
  if (absl::Status s = NormalizeJobSpec(&spec); !s.ok()) return s;
  if (validate_only) {
    v1::JobStatus status;
    status.set_name(spec.name());
    *status.mutable_spec() = std::move(spec);
    return status;
  }
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the coordinator is shutting down");
    // Ids read well in a terminal (fashion-cnn-3) and never reuse a directory on disk.
    std::string id;
    do {
      id = absl::StrCat(spec.name(), "-", ++name_counters_[spec.name()]);
    } while (jobs_.count(id) > 0 ||
             std::filesystem::exists(absl::StrCat(options_.state_dir, "/jobs/", id)));
    job = std::make_shared<Job>(id, spec, absl::StrCat(options_.state_dir, "/jobs/", id));
    jobs_[id] = job;
    order_.push_back(id);
    queue_.push_back(id);
  }
  job->SetStore(store_.get(), /*insert=*/true);
  job->Log(absl::StrCat("submitted: ", spec.trainer().num_workers(), " worker(s), strategy ",
                        spec.trainer().strategy(), ", model ",
                        spec.model().has_builtin() ? spec.model().builtin() : spec.model().torchscript()));
  if (absl::Status s = job->OpenFiles(options_.host); !s.ok()) {
    job->Finish(v1::FAILED, std::string(s.message()));
    job->Release();
  }
  Schedule();
  return job->Status(false);
}

std::shared_ptr<JobManager::Job> JobManager::Find(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::StatusOr<v1::JobStatus> JobManager::Get(const std::string& id, bool with_spec) const {
  std::shared_ptr<Job> job = Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'; see dtrain list"));
  return job->Status(with_spec);
}

std::vector<v1::JobStatus> JobManager::List() const {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : order_) jobs.push_back(jobs_.at(id));
  }
  std::vector<v1::JobStatus> out;
  for (const auto& job : jobs) out.push_back(job->Status(false));
  return out;
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& id) {
  std::shared_ptr<Job> job = Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  if (job->terminal()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id, "' already ended (", v1::JobState_Name(job->state()), ")"));
  }
  job->RequestCancel();
  bool was_queued = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find(queue_.begin(), queue_.end(), id);
    if (it != queue_.end()) {
      queue_.erase(it);
      was_queued = true;
    }
  }
  if (was_queued) {
    job->Finish(v1::CANCELLED, "cancelled by request before it started");
    job->Release();
  }
  return job->Status(false);
}

absl::StatusOr<std::vector<std::string>> JobManager::Logs(const std::string& id,
                                                          int64_t from_line,
                                                          int64_t* next_line) const {
  std::shared_ptr<Job> job = Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return job->Lines(from_line, next_line);
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobManager::Metrics(const std::string& id) const {
  std::shared_ptr<Job> job = Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return job->Points();
}

absl::StatusOr<int64_t> JobManager::Watch(const std::string& id, Watcher watcher) {
  std::shared_ptr<Job> job = Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return job->AddWatcher(std::move(watcher));
}

void JobManager::Unwatch(const std::string& id, int64_t handle) {
  if (std::shared_ptr<Job> job = Find(id)) job->RemoveWatcher(handle);
}

absl::Status JobManager::Restore(const std::string& path) {
  if (absl::Status s = MakeDirectories(options_.state_dir); !s.ok()) return s;
  DTRAIN_ASSIGN_OR_RETURN(store_, JobStore::Open(path));
  std::vector<std::string> skipped;
  DTRAIN_ASSIGN_OR_RETURN(std::vector<JobStore::StoredJob> stored, store_->LoadAll(&skipped));
  for (const std::string& id : skipped) {
    LogWarning(absl::StrCat("job ", id, " in ", path, " does not parse; skipped"), {{"job", id}});
  }
  for (JobStore::StoredJob& record : stored) {
    const std::string id = record.status.id();
    auto job = std::make_shared<Job>(std::move(record), absl::StrCat(options_.state_dir, "/jobs/", id),
                                     store_.get());
    const v1::JobState state = job->state();
    if (!IsTerminal(state)) {
      if (absl::Status s = job->OpenFiles(options_.host); !s.ok()) {
        job->Finish(v1::FAILED, std::string(s.message()));
        job->Release();
      }
    }
    if (!job->terminal() && state == v1::RUNNING) {
      // Workers still holding the old run are told to drop it (heartbeat's abandoned_job).
      workers_->MarkEnded(id);
      const std::string checkpoint = job->checkpoint();
      job->Log(checkpoint.empty()
                   ? "the coordinator restarted while this job ran, before its first checkpoint; "
                     "it starts over once its workers are back"
                   : absl::StrCat("the coordinator restarted while this job ran; it resumes from "
                                  "its last checkpoint ", checkpoint, " once its workers are back"));
      job->PrepareResume(checkpoint, "after the coordinator restarted");
    } else if (!job->terminal()) {
      job->Log("the coordinator restarted; the job is queued again");
    }
    absl::MutexLock lock(&mu_);
    jobs_[id] = job;
    order_.push_back(id);
    if (!job->terminal()) queue_.push_back(id);
  }
  return absl::OkStatus();
}

void JobManager::SetCoordinatorAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  coordinator_address_ = address;
}

void JobManager::Schedule() {
  // Jobs start in submission order: the head waits for its workers, and later jobs wait
  // behind it, so a large job is not starved by a stream of small ones.
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : finished_) {
      done.push_back(std::move(threads_[id]));
      threads_.erase(id);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
  {
    // Only now that their old thread is joined may Start give them a new one.
    absl::MutexLock lock(&mu_);
    for (auto it = requeued_.rbegin(); it != requeued_.rend(); ++it) queue_.push_front(*it);
    requeued_.clear();
  }
  while (true) {
    std::shared_ptr<Job> job;
    std::vector<v1::WorkerInfo> chosen;
    {
      absl::MutexLock lock(&mu_);
      while (!queue_.empty() && jobs_.at(queue_.front())->terminal()) queue_.pop_front();
      if (shut_down_ || queue_.empty()) return;
      job = jobs_.at(queue_.front());
      const int needed = job->spec().trainer().num_workers();
      for (const v1::WorkerInfo& w : workers_->List(absl::Now())) {
        if (w.state() == v1::WorkerInfo::ALIVE && w.job_id().empty() &&
            busy_workers_.count(w.name()) == 0) {
          chosen.push_back(w);
        }
      }
      if (static_cast<int>(chosen.size()) < needed) return;
      chosen.resize(needed);
      for (const v1::WorkerInfo& w : chosen) {
        busy_workers_.insert(w.name());
        workers_->Assign(w.name(), job->id());
      }
      queue_.pop_front();
    }
    Start(job, std::move(chosen));
  }
}

void JobManager::Start(const std::shared_ptr<Job>& job, std::vector<v1::WorkerInfo> workers) {
  std::vector<std::string> names;
  for (const v1::WorkerInfo& w : workers) names.push_back(w.name());
  job->SetRunning(workers);
  job->Log(absl::StrCat("placed on ", absl::StrJoin(names, ", ")));
  TrainerOptions options;
  options.job_id = job->id();
  options.spec = job->spec();
  if (job->resuming()) {
    options.clear_stale_runs = true;
    options.spec.set_resume_from(job->resume_from());
    options.resume_why = job->resume_why();
  }
  options.workers = workers;
  {
    absl::MutexLock lock(&mu_);
    options.coordinator = coordinator_address_;
  }
  options.checkpoint_dir = options.spec.checkpoint().dirpath().empty()
                               ? job->dir() + "/checkpoints"
                               : options.spec.checkpoint().dirpath();
  options.output_dir = job->dir();
  options.setup_timeout = options_.setup_timeout;
  options.step_timeout = options_.step_timeout;
  absl::MutexLock lock(&mu_);
  threads_[job->id()] = std::thread(
      [this, job, options = std::move(options)]() mutable { RunJob(job, std::move(options)); });
}

namespace {

// Failures a lost worker causes (its calls unreachable, its group aborted or timed out), as
// opposed to the job's own errors, which would recur on any workers.
bool MayBeALostWorker(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kAborted ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

std::string Names(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::string> names;
  for (const v1::WorkerInfo& w : workers) names.push_back(absl::StrCat("'", w.name(), "'"));
  return absl::StrJoin(names, ", ");
}

}  // namespace

void JobManager::RunJob(const std::shared_ptr<Job>& job, TrainerOptions options) {
  const int num_workers = options.spec.trainer().num_workers();
  const int min_workers = options.spec.trainer().min_workers();
  const int max_restarts = options.spec.trainer().max_restarts();
  const std::string first_resume_from = options.spec.resume_from();
  std::set<std::string> held;  // the workers this job keeps busy
  for (const v1::WorkerInfo& w : options.workers) held.insert(w.name());
  int restarts = 0;  // re-formations after lost workers; drains do not count
  bool requeue = false;
  while (true) {
    // Each run's group is new (named after the job, then job.1, job.2, ...): a re-formed job
    // need not wait for the old group to notice its dead member. Its token works there only.
    const int run = job->NextRun();
    options.group = run == 0 ? job->id() : absl::StrCat(job->id(), ".", run);
    options.job_token = access_ != nullptr ? access_->IssueJobToken(options.group) : "";
    std::vector<std::string> names;
    for (const v1::WorkerInfo& w : options.workers) names.push_back(w.name());
    options.draining_workers = [this, names] { return workers_->Draining(names); };
    Trainer trainer(options, job.get());
    job->SetTrainer(&trainer);
    const absl::Status status = trainer.Run();
    // Stopping workers were let go after a checkpoint: the job goes on without them, now or
    // once enough workers are idle; a planned stop is not a failure and uses no restart.
    const bool drained = !status.ok() && !trainer.drained_workers().empty() &&
                         !job->cancel_requested();
    const bool may_reform = drained || (!status.ok() && !job->cancel_requested() &&
                                        min_workers < num_workers && restarts < max_restarts &&
                                        MayBeALostWorker(status));
    // The outcome is known: users see it now, not after a stopped worker's teardown deadline.
    if (!may_reform) PublishOutcome(*job, status);
    trainer.Teardown();
    job->SetTrainer(nullptr);
    // After teardown: the workers left the group. One that did not (unreachable) is refused.
    if (access_ != nullptr) access_->RevokeJobToken(options.job_token);
    for (const std::string& name : trainer.unreachable_workers()) {
      workers_->MarkUnreachable(name);
      job->Log(absl::StrCat("worker '", name, "' was unreachable; it is not placed again until it "
                            "heartbeats"));
    }
    if (!may_reform) break;
    const std::vector<std::string> lost = trainer.lost_workers();
    if (lost.empty()) {  // every worker is fine: the failure is the job's own
      PublishOutcome(*job, status);
      break;
    }
    std::vector<v1::WorkerInfo> next;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& name : lost) {
        busy_workers_.erase(name);
        workers_->Assign(name, "");
        held.erase(name);
      }
      for (const v1::WorkerInfo& w : options.workers) {
        if (held.count(w.name()) > 0) next.push_back(w);
      }
      for (const v1::WorkerInfo& w : workers_->List(absl::Now())) {
        if (static_cast<int>(next.size()) >= num_workers) break;
        if (w.state() == v1::WorkerInfo::ALIVE && w.job_id().empty() &&
            busy_workers_.count(w.name()) == 0 &&
            std::find(lost.begin(), lost.end(), w.name()) == lost.end()) {
          next.push_back(w);
          busy_workers_.insert(w.name());
          workers_->Assign(w.name(), job->id());
          held.insert(w.name());
        }
      }
    }
    std::vector<std::string> lost_quoted;
    for (const std::string& name : lost) lost_quoted.push_back(absl::StrCat("'", name, "'"));
    const std::string checkpoint = job->checkpoint();
    const std::string resume_why =
        drained ? "after its workers were drained"
                : absl::StrCat("after losing worker(s) ", absl::StrJoin(lost_quoted, ", "));
    if (static_cast<int>(next.size()) < min_workers) {
      if (drained) {
        job->Log(absl::StrCat(status.message(), "; ", next.size(), " worker(s) left of the ",
                              min_workers, " needed: the job waits in the queue and resumes from ",
                              checkpoint, " when enough workers are idle"));
        job->PrepareResume(checkpoint, resume_why);
        requeue = true;
        break;
      }
      job->Finish(v1::FAILED, absl::StrCat(status.message(), "; the job cannot re-form: ",
                                           next.size(), " worker(s) left, min_workers is ",
                                           min_workers));
      break;
    }
    options.spec.set_resume_from(checkpoint.empty() ? first_resume_from : checkpoint);
    options.resume_why = resume_why;
    options.workers = next;
    options.clear_stale_runs = true;
    job->SetWorkers(next);
    if (drained) {
      job->Log(absl::StrCat(status.message(), "; re-forming on ", Names(next),
                            ", resuming from ", checkpoint));
      continue;
    }
    ++restarts;
    job->Log(absl::StrCat("lost worker(s) ", absl::StrJoin(lost_quoted, ", "), " (", status.message(),
                          "); re-forming on ", Names(next), " (restart ", restarts, " of ",
                          max_restarts, "), resuming from ",
                          checkpoint.empty() ? "the start (no checkpoint yet)" : checkpoint));
  }
  job->Release();
  // The workers are free again; the next Schedule (each monitor tick) may place a job on them,
  // and joins this thread.
  absl::MutexLock lock(&mu_);
  for (const std::string& name : held) {
    busy_workers_.erase(name);
    workers_->Assign(name, "");
  }
  finished_.push_back(job->id());
  if (requeue && !shut_down_) requeued_.push_back(job->id());
}

void JobManager::PublishOutcome(Job& job, const absl::Status& status) {
  if (status.ok()) {
    job.Finish(v1::SUCCEEDED, "");
  } else if (job.cancel_requested()) {
    job.Finish(v1::CANCELLED, "cancelled by request");
  } else {
    job.Finish(v1::FAILED, std::string(status.message()));
  }
}

void JobManager::Shutdown() {
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ && threads_.empty()) return;
    shut_down_ = true;
    for (auto& [id, thread] : threads_) threads.push_back(std::move(thread));
    threads_.clear();
    finished_.clear();
    for (auto& [id, job] : jobs_) jobs.push_back(job);
    queue_.clear();
  }
  for (const auto& job : jobs) {
    if (!job->terminal()) {
      // Interrupted, not cancelled: the database keeps it queued or running, so the next
      // coordinator on this state directory resumes it.
      job->SetStore(nullptr, /*insert=*/false);
      job->RequestCancel();
      if (job->state() == v1::QUEUED) job->Finish(v1::CANCELLED, "the coordinator shut down");
    }
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace dtrain

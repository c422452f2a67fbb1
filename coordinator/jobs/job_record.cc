#include "coordinator/jobs/job_record.h"

#include <algorithm>
#include <iterator>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "coordinator/jobs/hparams_file.h"

namespace dtrain {

JobRecord::JobRecord(std::string id, v1::JobSpec spec, std::string dir)
    : dir_(std::move(dir)), spec_(std::move(spec)) {
  status_id_ = id;
  status_.set_id(std::move(id));
  status_.set_name(spec_.name());
  status_.set_state(v1::QUEUED);
  status_.set_submitted_unix_ms(absl::ToUnixMillis(absl::Now()));
  status_.set_log_dir(dir_);
  status_.mutable_progress()->set_phase("waiting");
}

JobRecord::JobRecord(JobStore::StoredJob stored, std::string dir, JobStore* store)
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

void JobRecord::SetStore(JobStore* store, bool insert) {
  absl::MutexLock lock(&mu_);
  store_ = store;
  if (store_ == nullptr) return;
  if (insert) {
    Report(store_->Insert(spec_, status_));
  } else {
    PersistLocked(/*force=*/true);
  }
}

void JobRecord::PrepareResume(const std::string& checkpoint, const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    ckpt_path_ = checkpoint;
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

int JobRecord::NextRun() {
  absl::MutexLock lock(&mu_);
  return runs_++;
}

bool JobRecord::resuming() const {
  absl::MutexLock lock(&mu_);
  return resuming_;
}

std::string JobRecord::ckpt_path() const {
  absl::MutexLock lock(&mu_);
  return ckpt_path_;
}

std::string JobRecord::resume_why() const {
  absl::MutexLock lock(&mu_);
  return resume_why_;
}

std::string JobRecord::checkpoint() const {
  absl::MutexLock lock(&mu_);
  return status_.checkpoint();
}

v1::JobStatus JobRecord::Status(bool with_spec) const {
  absl::MutexLock lock(&mu_);
  v1::JobStatus copy = status_;
  if (with_spec) *copy.mutable_spec() = spec_;
  return copy;
}

void JobRecord::LogAt(LogLevel level, const std::string& line) {
  ::dtrain::Log(level, line, {{"job", status_id_}});
  const std::string stamped = absl::StrCat(
      absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone()), " ", line);
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

void JobRecord::Progress(const v1::JobProgress& progress) {
  {
    absl::MutexLock lock(&mu_);
    *status_.mutable_progress() = progress;
    PersistLocked(/*force=*/false);
  }
  Notify();
}

void JobRecord::Metrics(const std::vector<v1::MetricPoint>& points) {
  if (points.empty()) return;
  std::vector<std::string> notes;  // logged once the locks are released
  {
    // The file's writes hold metrics_mu_ alone: a new column rewrites metrics.csv (up to
    // 256 MiB), and the job's status calls, which take mu_, do not wait for it. Taken first, so
    // that two batches reach the file in the order they reach the status.
    absl::MutexLock file_lock(&metrics_mu_);
    const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    {
      absl::MutexLock lock(&mu_);
      std::vector<v1::MetricPoint> stamped = points;
      for (v1::MetricPoint& p : stamped) {
        p.set_wall_unix_ms(static_cast<int64_t>(now * 1000));
        (*status_.mutable_metrics())[p.name()] = p.value();
      }
      if (store_ != nullptr) Report(store_->AddMetrics(status_.id(), stamped));
      if (!points_in_store_) {
        points_.insert(points_.end(), std::make_move_iterator(stamped.begin()),
                       std::make_move_iterator(stamped.end()));
      }
      PersistLocked(/*force=*/false);
    }
    if (metrics_ != nullptr) {
      for (const v1::MetricPoint& p : points) {
        std::string note = metrics_->Add(p.name(), p.value(), p.step(), p.epoch(), now);
        if (!note.empty()) notes.push_back(std::move(note));
      }
      std::string note = metrics_->Flush();
      if (!note.empty()) notes.push_back(std::move(note));
    }
  }
  for (const std::string& note : notes) LogAt(LogLevel::kWarning, note);
  Notify();
}

void JobRecord::Checkpoint(const std::string& last, const std::string& best) {
  {
    absl::MutexLock lock(&mu_);
    status_.set_checkpoint(last);
    status_.set_best_checkpoint(best);
    PersistLocked(/*force=*/true);
  }
  Notify();
}

void JobRecord::KeepFile(const v1::JobFile& file, const std::vector<std::string>& dropped) {
  std::vector<std::string> freed;
  std::function<void(std::vector<std::string>)> callback;
  {
    absl::MutexLock lock(&mu_);
    auto* files = status_.mutable_files();
    std::vector<std::string> candidates;
    for (int i = files->size() - 1; i >= 0; --i) {
      const v1::JobFile& old = files->Get(i);
      if (old.name() == file.name() || absl::c_linear_search(dropped, old.name())) {
        if (!old.digest().empty()) candidates.push_back(old.digest());
        files->DeleteSubrange(i, 1);
      }
    }
    *files->Add() = file;
    for (const std::string& digest : candidates) {
      const bool still =
          absl::c_any_of(*files, [&](const v1::JobFile& f) { return f.digest() == digest; });
      if (!still && !absl::c_linear_search(freed, digest)) freed.push_back(digest);
    }
    PersistLocked(/*force=*/true);
    callback = files_dropped_;
  }
  if (!freed.empty() && callback) callback(std::move(freed));
  Notify();
}

std::vector<v1::JobFile> JobRecord::Files() const {
  absl::MutexLock lock(&mu_);
  return {status_.files().begin(), status_.files().end()};
}

void JobRecord::SetFilesDropped(std::function<void(std::vector<std::string>)> callback) {
  absl::MutexLock lock(&mu_);
  files_dropped_ = std::move(callback);
}

void JobRecord::Predictions(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    status_.set_predictions(path);
    PersistLocked(/*force=*/true);
  }
  Notify();
}

absl::Status JobRecord::OpenFiles(const std::string& host) {
  if (absl::Status s = MakeDirectories(dir_); !s.ok()) return s;
  // A restored job goes on writing its files where they ended.
  std::string kept;
  absl::StatusOr<std::unique_ptr<MetricsLog>> metrics =
      MetricsLog::Create(dir_, host, restored_, &kept);
  if (!metrics.ok()) return metrics.status();
  if (!kept.empty()) LogAt(LogLevel::kWarning, kept);
  if (absl::Status s = WriteHparamsFile(dir_ + "/hparams.yaml", spec_); !s.ok()) return s;
  absl::MutexLock file_lock(&metrics_mu_);
  metrics_ = std::move(*metrics);
  absl::MutexLock lock(&mu_);
  log_file_.open(dir_ + "/job.log", std::ios::app);
  if (!restored_) {
    for (const std::string& line : lines_) log_file_ << line << "\n";
  }
  log_file_.flush();
  return absl::OkStatus();
}

void JobRecord::HyperParameters(const std::vector<std::pair<std::string, std::string>>& values) {
  std::vector<std::string> left_out;
  const absl::Status written = WriteHparamsFile(dir_ + "/hparams.yaml", spec_, values, &left_out);
  for (const std::string& line : left_out) LogAt(LogLevel::kWarning, line);
  if (!written.ok()) {
    LogAt(LogLevel::kWarning,
          absl::StrCat("hparams.yaml keeps the spec only: ", written.message()));
  }
}

void JobRecord::SetRunning(const std::vector<v1::WorkerInfo>& workers) {
  {
    absl::MutexLock lock(&mu_);
    status_.set_state(v1::RUNNING);
    status_.set_started_unix_ms(absl::ToUnixMillis(absl::Now()));
    for (const v1::WorkerInfo& w : workers) status_.add_workers(w.name());
    PersistLocked(/*force=*/true);
  }
  Notify();
}

void JobRecord::Release() {
  absl::MutexLock file_lock(&metrics_mu_);  // before mu_, as Metrics takes them
  {
    absl::MutexLock lock(&mu_);
    if (!IsTerminal(status_.state())) return;
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
  // Outside mu_: closing writes an unfinished last row again, which may rewrite the file.
  metrics_.reset();
}

void JobRecord::SetWorkers(const std::vector<v1::WorkerInfo>& workers) {
  {
    absl::MutexLock lock(&mu_);
    status_.clear_workers();
    for (const v1::WorkerInfo& w : workers) status_.add_workers(w.name());
    PersistLocked(/*force=*/true);
  }
  Notify();
}

void JobRecord::Finish(v1::JobState state, const std::string& reason) {
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

bool JobRecord::terminal() const {
  absl::MutexLock lock(&mu_);
  return IsTerminal(status_.state());
}

void JobRecord::MarkSucceeding() {
  absl::MutexLock lock(&mu_);
  succeeding_ = true;
  // A shutdown that came just before the run's success: a run that succeeded is never to be
  // resumed, so its end is stored after all.
  if (store_ == nullptr) store_ = interrupted_store_;
  PersistLocked(/*force=*/true);
}

bool JobRecord::succeeding() const {
  absl::MutexLock lock(&mu_);
  return succeeding_;
}

bool JobRecord::RequestCancelUnlessEnded() {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(status_.state()) || succeeding_) return false;
  cancel_requested_ = true;
  if (run_ != nullptr) run_->Cancel();
  return true;
}

bool JobRecord::Interrupt() {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(status_.state()) || succeeding_) return false;
  interrupted_store_ = store_;
  store_ = nullptr;
  cancel_requested_ = true;
  if (run_ != nullptr) run_->Cancel();
  return true;
}

v1::JobState JobRecord::state() const {
  absl::MutexLock lock(&mu_);
  return status_.state();
}

std::vector<std::string> JobRecord::Lines(int64_t from, int64_t* next) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> on_disk;
  const std::vector<std::string>& lines = lines_on_disk_ ? (on_disk = ReadLogFile()) : lines_;
  from = std::clamp<int64_t>(from, 0, static_cast<int64_t>(lines.size()));
  *next = static_cast<int64_t>(lines.size());
  return std::vector<std::string>(lines.begin() + from, lines.end());
}

std::vector<v1::MetricPoint> JobRecord::Points() const {
  absl::MutexLock lock(&mu_);
  if (!points_in_store_) return points_;
  if (store_ == nullptr) return {};
  absl::StatusOr<std::vector<v1::MetricPoint>> points = store_->Points(status_.id());
  return points.ok() ? std::move(*points) : std::vector<v1::MetricPoint>();
}

int64_t JobRecord::AddWatcher(JobWatcher watcher) {
  absl::MutexLock lock(&watch_mu_);
  const int64_t handle = ++next_watcher_;
  watchers_[handle] = std::move(watcher);
  watchers_[handle](Status(false));
  return handle;
}

void JobRecord::RemoveWatcher(int64_t handle) {
  absl::MutexLock lock(&watch_mu_);
  watchers_.erase(handle);
}

void JobRecord::RequestCancel() {
  absl::MutexLock lock(&mu_);
  cancel_requested_ = true;
  if (run_ != nullptr) run_->Cancel();
}

bool JobRecord::cancel_requested() const {
  absl::MutexLock lock(&mu_);
  return cancel_requested_;
}

void JobRecord::WorkerLost(const std::string& worker, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (run_ != nullptr) run_->WorkerLost(worker, why);
}

void JobRecord::SetRun(JobRun* run) {
  absl::MutexLock lock(&mu_);
  run_ = run;
  if (run_ != nullptr && cancel_requested_) run_->Cancel();
}

std::vector<std::string> JobRecord::ReadLogFile() const {
  std::vector<std::string> lines;
  std::ifstream log(dir_ + "/job.log");
  for (std::string line; std::getline(log, line);) lines.push_back(std::move(line));
  return lines;
}

void JobRecord::PersistLocked(bool force) {
  if (store_ == nullptr) return;
  const absl::Time now = absl::Now();
  if (!force && now - last_persist_ < absl::Seconds(1)) return;
  last_persist_ = now;
  if (!succeeding_ || IsTerminal(status_.state())) {
    Report(store_->Update(status_));
    return;
  }
  // What Finish will publish once the workers are free (MarkSucceeding).
  v1::JobStatus stored = status_;
  stored.set_state(v1::SUCCEEDED);
  stored.clear_reason();
  stored.set_finished_unix_ms(absl::ToUnixMillis(now));
  stored.mutable_progress()->set_phase("done");
  Report(store_->Update(stored));
}

void JobRecord::Report(const absl::Status& status) {
  if (status.ok() || store_error_reported_) return;
  store_error_reported_ = true;
  LogError(absl::StrCat("job ", status_.id(), ": ", status.message(),
                        " (later changes may not survive a restart)"),
           {{"job", status_.id()}});
}

void JobRecord::Notify() {
  const v1::JobStatus now = Status(false);
  absl::MutexLock lock(&watch_mu_);
  for (auto& [handle, watcher] : watchers_) watcher(now);
}

}  // namespace dtrain

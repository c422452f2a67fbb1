#include "coordinator/jobs/job_manager.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/file_reference.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/setup_request.h"
#include "common/status_macros.h"
#include "coordinator/jobs/grpc_worker_group.h"
#include "coordinator/jobs/job_artifacts.h"
#include "coordinator/jobs/job_record.h"
#include "coordinator/jobs/model_checkpoint.h"
#include "coordinator/jobs/run_policy.h"
#include "coordinator/jobs/trainer.h"

namespace dtrain {

JobManager::JobManager(JobManagerOptions options, WorkerRegistry* workers, AccessControl* access)
    : options_(std::move(options)), workers_(workers), access_(access) {}

JobManager::~JobManager() { Shutdown(); }

absl::StatusOr<v1::DeleteJobResponse> JobManager::Delete(const std::string& id) {
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<JobRecord> job, FindRequested(id));
  {
    // Shutdown joins the jobs' threads itself: the wait below would not see them.
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the coordinator is shutting down");
  }
  if (!job->terminal() && !job->succeeding()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' is ", v1::JobState_Name(job->state()),
                     "; cancel it first (dtrain cancel ", id, "), then delete it"));
  }
  const std::set<std::string> named = DigestsNamedBy(*job);
  const std::vector<std::string> candidates(named.begin(), named.end());
  // An ended job's thread may still be tearing it down on its workers (a failure is published
  // first; a success is being released): wait for it, within the teardown's own deadline.
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return threads_.count(id) == 0 || absl::c_linear_search(finished_, id);
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60))) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job '", id, "' is still releasing its workers after 60 s; try again later"));
    }
    if (auto it = threads_.find(id); it != threads_.end()) {
      thread = std::move(it->second);
      threads_.erase(it);
      finished_.erase(std::remove(finished_.begin(), finished_.end(), id), finished_.end());
    }
    jobs_.erase(id);
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  }
  if (thread.joinable()) thread.join();
  if (store_ != nullptr) DTRAIN_RETURN_IF_ERROR(store_->Delete(id));
  v1::DeleteJobResponse response;
  response.set_id(id);
  int64_t freed = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job->dir(), error)) {
    if (entry.is_regular_file(error)) freed += static_cast<int64_t>(entry.file_size(error));
  }
  std::filesystem::remove_all(job->dir(), error);
  int removed = 0;
  freed += FreeUnused(candidates, &removed);
  response.set_files_removed(removed);
  response.set_freed_bytes(freed);
  LogInfo(
      absl::StrCat("job ", id, " deleted: ", removed, " stored file(s), ", freed, " bytes freed"),
      {{"job", id}});
  return response;
}

absl::StatusOr<v1::JobStatus> JobManager::Submit(v1::JobSpec spec, bool validate_only) {
  const OfferedPlugins offered = workers_->Offered();
  if (absl::Status s = NormalizeJobSpec(&spec, &offered); !s.ok()) return s;
  // Another job's checkpoint is named by its content from here on: deleting that job later
  // does not take it from this one.
  if (IsJobFileReference(spec.ckpt_path())) {
    absl::StatusOr<std::string> resolved = ResolveFile(spec.ckpt_path());
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrCat("ckpt_path: ", resolved.status().message()));
    }
    spec.set_ckpt_path(*resolved);
  }
  // Checked and queued under the freeing lock: a file found here is not freed before the job
  // names it.
  absl::ReleasableMutexLock freeing(&free_mu_);
  if (artifacts_ != nullptr) {
    for (const auto& [field, digest] : SpecArtifacts(spec)) {
      if (!artifacts_->Size(digest).ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": ", digest,
            " is not stored on the coordinator; upload it first (dtrain fit and the Python "
            "client do so for a local path)"));
      }
    }
  }
  if (validate_only) {
    v1::JobStatus status;
    status.set_name(spec.name());
    *status.mutable_spec() = std::move(spec);
    return status;
  }
  std::shared_ptr<JobRecord> job;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the coordinator is shutting down");
    // Ids read well in a terminal (fashion-cnn-3) and never reuse a directory on disk.
    std::string id;
    do {
      id = absl::StrCat(spec.name(), "-", ++name_counters_[spec.name()]);
    } while (jobs_.count(id) > 0 ||
             std::filesystem::exists(absl::StrCat(options_.state_dir, "/jobs/", id)));
    job = std::make_shared<JobRecord>(id, spec, absl::StrCat(options_.state_dir, "/jobs/", id));
    // Logged before the job is queued: a scheduler on another thread may place it at once, and
    // "submitted" must stay the log's first line.
    job->Log(absl::StrCat(
        "submitted: ", spec.trainer().num_nodes(), " worker(s), strategy ",
        spec.trainer().strategy(), ", model ",
        spec.model().has_builtin() ? spec.model().builtin() : spec.model().torchscript()));
    jobs_[id] = job;
    order_.push_back(id);
    queue_.push_back(id);
  }
  freeing.Release();
  Track(job);
  job->SetStore(store_.get(), /*insert=*/true);
  if (absl::Status s = job->OpenFiles(options_.host); !s.ok()) {
    job->Finish(v1::FAILED, std::string(s.message()));
    job->Release();
  }
  Schedule();
  return job->Status(false);
}

void JobManager::WorkersLost(const std::vector<WorkerRegistry::LostWorker>& lost) {
  for (const WorkerRegistry::LostWorker& worker : lost) {
    if (std::shared_ptr<JobRecord> job = Find(worker.job_id))
      job->WorkerLost(worker.name, worker.why);
  }
}

std::shared_ptr<JobRecord> JobManager::Find(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<JobRecord>> JobManager::FindRequested(const std::string& id) const {
  // Ids are "<spec name>-<n>", and a spec's name is at most 128 bytes.
  constexpr size_t kMostIdBytes = 256;
  if (id.empty()) return absl::InvalidArgumentError("id is empty: name a job (dtrain list)");
  if (id.size() > kMostIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "id is ", id.size(), " bytes; no job id is longer than ", kMostIdBytes, " (dtrain list)"));
  }
  std::shared_ptr<JobRecord> job = Find(id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'; see dtrain list"));
  }
  return job;
}

void JobManager::DryRun(v1::JobSpec spec,
                        std::function<void(absl::StatusOr<v1::DryRunResponse>)> done) {
  const OfferedPlugins offered = workers_->Offered();
  if (absl::Status s = NormalizeJobSpec(&spec, &offered); !s.ok()) return done(s);
  struct Call {
    std::unique_ptr<v1::Worker::Stub> stub;
    grpc::ClientContext context;
    v1::DryRunRequest request;
    v1::DryRunResponse response;
  };
  auto call = std::make_shared<Call>();
  std::string reservation, coordinator;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return done(absl::UnavailableError("the coordinator is shutting down"));
    reservation = absl::StrCat("dry-run-", ++dry_run_counter_);
    coordinator = coordinator_address_;
  }
  // Reserved like a job's, so no job is placed on it while it checks this one.
  std::vector<v1::WorkerInfo> picked =
      workers_->Reserve(reservation, 1, 1, {}, absl::Now(), PluginsNamedBy(spec));
  if (picked.empty()) {
    return done(absl::FailedPreconditionError(
        "a dry run needs an idle worker and none is idle now; try again when one is (dtrain "
        "workers lists them)"));
  }
  const std::string name = picked[0].name();
  SetupContext context;
  context.job_id = reservation;
  context.coordinator = coordinator;
  *call->request.mutable_setup() = MakeSetupRequest(spec, context);
  call->request.set_batch_size(spec.data().batch_size());
  call->stub = v1::Worker::NewStub(ConnectToCoordinator(picked[0].address()));
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.setup_timeout));
  {
    absl::MutexLock lock(&mu_);
    dry_runs_.insert(&call->context);
  }
  call->stub->async()->DryRun(
      &call->context, &call->request, &call->response,
      [this, call, name, done = std::move(done)](grpc::Status status) {
        workers_->Release(name);
        if (status.ok()) {
          done(std::move(call->response));
        } else {
          done(absl::Status(
              static_cast<absl::StatusCode>(status.error_code()),
              absl::StrCat("dry run on worker '", name, "': ", status.error_message())));
        }
        absl::MutexLock lock(&mu_);
        dry_runs_.erase(&call->context);
      });
}

absl::StatusOr<v1::JobStatus> JobManager::Get(const std::string& id, bool with_spec) const {
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<JobRecord> job, FindRequested(id));
  return job->Status(with_spec);
}

std::vector<v1::JobStatus> JobManager::List() const {
  std::vector<std::shared_ptr<JobRecord>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : order_) jobs.push_back(jobs_.at(id));
  }
  std::vector<v1::JobStatus> out;
  for (const auto& job : jobs) out.push_back(job->Status(false));
  return out;
}

std::vector<v1::JobStatus> JobManager::List(size_t first, size_t count, bool newest_first,
                                            size_t* total) const {
  std::vector<std::shared_ptr<JobRecord>> jobs;
  {
    absl::MutexLock lock(&mu_);
    *total = order_.size();
    for (size_t k = first; k < order_.size() && jobs.size() < count; ++k) {
      jobs.push_back(jobs_.at(order_[newest_first ? order_.size() - 1 - k : k]));
    }
  }
  std::vector<v1::JobStatus> out;
  out.reserve(jobs.size());
  for (const auto& job : jobs) out.push_back(job->Status(false));
  return out;
}

std::vector<v1::JobStatus> JobManager::ListWhere(
    const std::function<bool(const std::string& id, v1::JobState state)>& want) const {
  std::vector<std::shared_ptr<JobRecord>> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs.reserve(order_.size());
    for (const std::string& id : order_) jobs.push_back(jobs_.at(id));
  }
  std::vector<v1::JobStatus> out;
  for (const auto& job : jobs) {
    if (want(job->id(), job->state())) out.push_back(job->Status(false));
  }
  return out;
}

JobCounts JobManager::Count() const {
  std::vector<std::shared_ptr<JobRecord>> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs.reserve(order_.size());
    for (const std::string& id : order_) jobs.push_back(jobs_.at(id));
  }
  JobCounts counts;
  for (const auto& job : jobs) {
    const v1::JobState state = job->state();
    ++counts.by_state[state];
    if (state == v1::RUNNING) {
      counts.running_samples_per_second += job->Status(false).progress().samples_per_second();
    }
  }
  return counts;
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& id) {
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<JobRecord> job, FindRequested(id));
  if (!job->RequestCancelUnlessEnded()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' already ended (",
                     job->terminal() ? v1::JobState_Name(job->state())
                                     : "SUCCEEDED; it is releasing its workers",
                     ")"));
  }
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

absl::StatusOr<std::vector<std::string>> JobManager::Logs(const std::string& id, int64_t from_line,
                                                          int64_t* next_line) const {
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<JobRecord> job, FindRequested(id));
  return job->Lines(from_line, next_line);
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobManager::Metrics(const std::string& id) const {
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<JobRecord> job, FindRequested(id));
  return job->Points();
}

absl::StatusOr<int64_t> JobManager::Watch(const std::string& id, Watcher watcher) {
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<JobRecord> job, FindRequested(id));
  return job->AddWatcher(std::move(watcher));
}

void JobManager::Unwatch(const std::string& id, int64_t handle) {
  if (std::shared_ptr<JobRecord> job = Find(id)) job->RemoveWatcher(handle);
}

absl::Status JobManager::Restore(const std::string& path) {
  if (absl::Status s =
          MakePrivateDirectory(options_.state_dir, "the coordinator's state directory");
      !s.ok()) {
    return s;
  }
  DTRAIN_ASSIGN_OR_RETURN(store_, JobStore::Open(path));
  std::vector<std::string> skipped;
  DTRAIN_ASSIGN_OR_RETURN(std::vector<JobStore::StoredJob> stored, store_->LoadAll(&skipped));
  for (const std::string& id : skipped) {
    LogWarning(absl::StrCat("job ", id, " in ", path, " does not parse; skipped"), {{"job", id}});
  }
  std::vector<std::string> ran;  // RUNNING when the last coordinator stopped
  for (JobStore::StoredJob& record : stored) {
    const std::string id = record.status.id();
    auto job = std::make_shared<JobRecord>(
        std::move(record), absl::StrCat(options_.state_dir, "/jobs/", id), store_.get());
    const v1::JobState state = job->state();
    if (!IsTerminal(state)) {
      if (absl::Status s = job->OpenFiles(options_.host); !s.ok()) {
        job->Finish(v1::FAILED, std::string(s.message()));
        job->Release();
      }
    }
    // Workers still holding a run of an ended job are told to drop it (heartbeat's
    // abandoned_job): the last coordinator may have been killed during its teardown, after the
    // database recorded its end. The RUNNING ones are marked below, last, so that the registry's
    // bounded memory of ended jobs keeps them whatever the number of finished jobs.
    if (IsTerminal(state)) {
      workers_->MarkEnded(id);
    } else if (state == v1::RUNNING) {
      ran.push_back(id);
    }
    if (!job->terminal() && state == v1::RUNNING) {
      const std::string checkpoint = job->checkpoint();
      // Before its first checkpoint the run starts where the user asked it to, not from scratch.
      const std::string& start = job->spec().ckpt_path();
      job->Log(!checkpoint.empty()
                   ? absl::StrCat("the coordinator restarted while this job ran; it resumes from "
                                  "its last checkpoint ",
                                  checkpoint, " once its workers are back")
                   : absl::StrCat("the coordinator restarted while this job ran, before its first "
                                  "checkpoint; it starts again from ",
                                  start.empty() ? "the beginning" : start,
                                  " once its workers are back"));
      job->PrepareResume(checkpoint.empty() ? start : checkpoint,
                         "after the coordinator restarted");
    } else if (!job->terminal()) {
      job->Log("the coordinator restarted; the job is queued again");
    }
    Track(job);
    absl::MutexLock lock(&mu_);
    jobs_[id] = job;
    order_.push_back(id);
    if (!job->terminal()) queue_.push_back(id);
  }
  for (const std::string& id : ran) workers_->MarkEnded(id);
  return absl::OkStatus();
}

void JobManager::SetCoordinatorAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  coordinator_address_ = address;
}

bool JobManager::Waiting() const {
  absl::MutexLock lock(&mu_);
  return !queue_.empty() || !finished_.empty() || !requeued_.empty();
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
    std::shared_ptr<JobRecord> job;
    std::vector<v1::WorkerInfo> chosen;
    {
      absl::MutexLock lock(&mu_);
      while (!queue_.empty() && jobs_.at(queue_.front())->terminal()) queue_.pop_front();
      if (shut_down_ || queue_.empty()) return;
      job = jobs_.at(queue_.front());
      const int needed = job->spec().trainer().num_nodes();
      chosen = workers_->Reserve(job->id(), needed, needed, {}, absl::Now(),
                                 PluginsNamedBy(job->spec()));
      if (chosen.empty()) return;
      queue_.pop_front();
    }
    Start(job, std::move(chosen));
  }
}

void JobManager::Start(const std::shared_ptr<JobRecord>& job, std::vector<v1::WorkerInfo> workers) {
  std::vector<std::string> names;
  for (const v1::WorkerInfo& w : workers) names.push_back(w.name());
  job->SetRunning(workers);
  job->Log(absl::StrCat("placed on ", absl::StrJoin(names, ", ")));
  TrainerOptions options;
  options.job_id = job->id();
  options.submitted = absl::FromUnixMillis(job->Status(false).submitted_unix_ms());
  options.spec = job->spec();
  if (job->resuming()) {
    options.clear_stale_runs = true;
    options.spec.set_ckpt_path(job->ckpt_path());
    options.resume_why = job->resume_why();
  }
  options.workers = workers;
  {
    absl::MutexLock lock(&mu_);
    options.coordinator = coordinator_address_;
  }
  options.resolve_file = [this](const std::string& reference) { return ResolveFile(reference); };
  options.sibling_checkpoints = [job](const std::string& reference) {
    std::vector<std::string> out;
    if (!IsJobFileReference(reference)) return ModelCheckpoint::Siblings(reference);
    std::vector<v1::JobFile> files = job->Files();
    std::sort(files.begin(), files.end(), [](const v1::JobFile& a, const v1::JobFile& b) {
      return a.created_unix_ms() > b.created_unix_ms();
    });
    for (const v1::JobFile& file : files) {
      if (file.kind() == "checkpoint" && file.location() != reference)
        out.push_back(file.location());
    }
    return out;
  };
  if (artifacts_ != nullptr) {
    options.store_file = [this](const std::string& path) { return artifacts_->ImportFile(path); };
  }
  options.output_dir = job->dir();
  options.setup_timeout = options_.setup_timeout;
  options.step_timeout = options_.step_timeout;
  absl::MutexLock lock(&mu_);
  threads_[job->id()] = std::thread([this, job, options = std::move(options)]() mutable {
    // Named so that top -H and perf tell a job's loop from gRPC's threads.
    pthread_setname_np(pthread_self(), "dtrain-job");
    RunJob(job, std::move(options));
  });
}

namespace {

std::string Names(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::string> names;
  for (const v1::WorkerInfo& w : workers) names.push_back(absl::StrCat("'", w.name(), "'"));
  return absl::StrJoin(names, ", ");
}

}  // namespace

void JobManager::RunJob(const std::shared_ptr<JobRecord>& job, TrainerOptions options) {
  const int num_nodes = options.spec.trainer().num_nodes();
  const int min_nodes = options.spec.trainer().min_nodes();
  const int max_restarts = options.spec.trainer().max_restarts();
  const std::string first_ckpt_path = options.spec.ckpt_path();
  std::set<std::string> held;  // the workers this job keeps busy
  for (const v1::WorkerInfo& w : options.workers) held.insert(w.name());
  int restarts = 0;  // re-formations after lost workers; drains do not count
  bool requeue = false;
  // A success is published once its workers are free, so that whoever sees SUCCEEDED can place
  // the next job (or a dry run) on them at once; a failure is published before the teardown, to
  // be seen without waiting a stopped worker's teardown deadline.
  bool publish_at_end = false;
  std::set<std::string> torn_down;  // the last run's workers that left the job cleanly
  while (true) {
    // Each run's group is new (named after the job, then job.1, job.2, ...): a re-formed job
    // need not wait for the old group to notice its dead member. Its token works there only.
    const int run = job->NextRun();
    options.group = run == 0 ? job->id() : absl::StrCat(job->id(), ".", run);
    options.job_token = access_ != nullptr ? access_->IssueJobToken(options.group) : "";
    std::vector<std::string> names;
    for (const v1::WorkerInfo& w : options.workers) names.push_back(w.name());
    options.draining_workers = [this, names] { return workers_->Draining(names); };
    // The files earlier runs kept: the top-k checkpoints carry on from them.
    options.files = job->Files();
    std::unique_ptr<JobRun> made =
        options_.make_run
            ? options_.make_run(options, job.get())
            : std::make_unique<Trainer>(
                  options, job.get(),
                  std::make_unique<GrpcWorkerGroup>(options.job_id, options.workers,
                                                    options.setup_timeout, options.step_timeout));
    JobRun& current = *made;
    job->SetRun(&current);
    RunEnding ending;
    ending.status = current.Run();
    ending.cancel_requested = job->cancel_requested();
    // Stopping workers were let go after a checkpoint: the job goes on without them, now or
    // once enough workers are idle; a planned stop is not a failure and uses no restart.
    ending.drained = !current.drained_workers().empty();
    ending.num_nodes = num_nodes;
    ending.min_nodes = min_nodes;
    ending.max_restarts = max_restarts;
    ending.restarts = restarts;
    const absl::Status& status = ending.status;
    const bool may_reform = MayRunAgain(ending);
    publish_at_end = !may_reform && status.ok();
    if (publish_at_end) job->MarkSucceeding();
    if (!may_reform && !publish_at_end) PublishOutcome(*job, status);
    current.Teardown();
    job->SetRun(nullptr);
    torn_down = held;
    for (const std::string& name : current.lost_workers()) torn_down.erase(name);
    for (const std::string& name : current.unreachable_workers()) torn_down.erase(name);
    // After teardown: the workers left the group. One that did not (unreachable) is refused.
    if (access_ != nullptr) access_->RevokeJobToken(options.job_token);
    for (const std::string& name : current.unreachable_workers()) {
      workers_->MarkUnreachable(name);
      job->Log(absl::StrCat("worker '", name,
                            "' was unreachable; it is not placed again until it "
                            "heartbeats"));
    }
    if (!may_reform) break;
    const std::vector<std::string> lost = current.lost_workers();
    // Survivors, then idle replacements (never a worker this run lost), up to num_nodes.
    std::vector<v1::WorkerInfo> next;
    if (!lost.empty()) {
      for (const std::string& name : lost) {
        workers_->Release(name);
        held.erase(name);
      }
      for (const v1::WorkerInfo& w : options.workers) {
        if (held.count(w.name()) > 0) next.push_back(w);
      }
      const std::set<std::string> exclude(lost.begin(), lost.end());
      for (v1::WorkerInfo& w :
           workers_->Reserve(job->id(), 0, num_nodes - static_cast<int>(next.size()), exclude,
                             absl::Now(), PluginsNamedBy(job->spec()))) {
        held.insert(w.name());
        next.push_back(std::move(w));
      }
    }
    const RunDecision decision =
        DecideNextRun(ending, static_cast<int>(lost.size()), static_cast<int>(next.size()));
    if (decision.next == NextRun::kEnd) {  // every worker is fine: the failure is the job's own
      PublishOutcome(*job, status);
      break;
    }
    std::vector<std::string> lost_quoted;
    for (const std::string& name : lost) lost_quoted.push_back(absl::StrCat("'", name, "'"));
    // The next run starts from the last checkpoint, or where this one started when it wrote
    // none (a worker that stopped before its Setup: nothing was trained).
    const std::string checkpoint = job->checkpoint();
    const std::string ckpt_path = checkpoint.empty() ? first_ckpt_path : checkpoint;
    const std::string resume_text = ckpt_path.empty() ? "the start (no checkpoint yet)" : ckpt_path;
    const std::string resume_why =
        ending.drained ? "after its workers were drained"
                       : absl::StrCat("after losing worker(s) ", absl::StrJoin(lost_quoted, ", "));
    if (decision.next != NextRun::kReform) {
      if (decision.next == NextRun::kRequeue) {
        job->Log(absl::StrCat(status.message(), "; ", next.size(), " worker(s) left of the ",
                              min_nodes, " needed: the job waits in the queue and resumes from ",
                              resume_text, " when enough workers are idle"));
        job->PrepareResume(ckpt_path, resume_why);
        requeue = true;
        break;
      }
      job->Finish(v1::FAILED,
                  absl::StrCat(status.message(), "; the job cannot re-form: ", next.size(),
                               " worker(s) left, min_nodes is ", min_nodes));
      break;
    }
    options.spec.set_ckpt_path(ckpt_path);
    options.resume_why = resume_why;
    options.workers = next;
    options.clear_stale_runs = true;
    job->SetWorkers(next);
    if (!decision.uses_restart) {
      job->Log(absl::StrCat(status.message(), "; re-forming on ", Names(next), ", resuming from ",
                            resume_text));
      continue;
    }
    ++restarts;
    job->Log(absl::StrCat("lost worker(s) ", absl::StrJoin(lost_quoted, ", "), " (",
                          status.message(), "); re-forming on ", Names(next), " (restart ",
                          restarts, " of ", max_restarts, "), resuming from ", resume_text));
  }
  // The workers are free again; the next Schedule (each monitor tick) may place a job on them,
  // and joins this thread.
  for (const std::string& name : held) {
    if (torn_down.count(name) > 0) {
      workers_->ReleaseTornDown(name);
    } else {
      workers_->Release(name);
    }
  }
  if (publish_at_end) PublishOutcome(*job, absl::OkStatus());
  job->Release();  // after the outcome: it closes only an ended job's files
  absl::MutexLock lock(&mu_);
  finished_.push_back(job->id());
  if (requeue && !shut_down_) requeued_.push_back(job->id());
}

void JobManager::PublishOutcome(JobRecord& job, const absl::Status& status) {
  const Outcome outcome = OutcomeOf(status, job.cancel_requested());
  job.Finish(outcome.state, outcome.reason);
}

void JobManager::Shutdown() {
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<JobRecord>> jobs;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ && threads_.empty()) return;
    shut_down_ = true;
    for (auto& [id, thread] : threads_) threads.push_back(std::move(thread));
    threads_.clear();
    finished_.clear();
    for (auto& [id, job] : jobs_) jobs.push_back(job);
    queue_.clear();
    for (grpc::ClientContext* context : dry_runs_) context->TryCancel();
  }
  {
    // Their callbacks use this manager: wait for them (cancelled, they come at once).
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::set<grpc::ClientContext*>* runs) { return runs->empty(); }, &dry_runs_),
        absl::Seconds(30));
  }
  for (const auto& job : jobs) {
    // Interrupted, not cancelled: the database keeps it queued or running, so the next
    // coordinator on this state directory resumes it. A succeeding job is left to its thread,
    // joined below, which stores SUCCEEDED.
    if (job->Interrupt() && job->state() == v1::QUEUED) {
      job->Finish(v1::CANCELLED, "the coordinator shut down");
    }
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace dtrain

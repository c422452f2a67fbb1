#include "worker/service/worker_service.h"

#include <cstdio>

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/bearer_token.h"
#include "common/callback_reactors.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/streaming.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/job.h"
#include "worker/runtime/local_work.h"
#include "worker/runtime/registered_plugins.h"
#include "worker/runtime/spawned_job.h"
#include "worker/runtime/worker_allocator.h"
#include "worker/service/request_limits.h"
#include "worker/service/setup_paths.h"
#include "worker/service/state_dict_stream.h"

namespace dtrain {

WorkerService::WorkerService(WorkerServiceOptions options)
    : options_(std::move(options)),
      identity_(options_.identity),
      // Threads 0 is libtorch's default, one per core the process may use: say how many.
      placed_(FormatCpuList(options_.identity.cpus),
              options_.identity.threads > 0 ? options_.identity.threads
                                            : static_cast<int>(options_.allowed_cpus.size())),
      executor_([this] { ExecutorLoop(); }) {}

WorkerService::~WorkerService() {
  // A stop that timed out leaves the executor running the stuck call: its owner exits instead
  // of destroying this service (WorkerServer::Stop), or the join below would wait for it.
  StopNow().IgnoreError();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  executor_.join();
}

grpc::ServerUnaryReactor* WorkerService::Enqueue(grpc::CallbackServerContext* context,
                                                 std::function<absl::Status()> body,
                                                 std::string setup_job,
                                                 std::shared_ptr<CallCanceller> canceller,
                                                 WorkerTrainOrder order) {
  auto task = std::make_shared<Task>();
  if (canceller != nullptr) task->canceller = std::move(canceller);
  task->body = std::move(body);
  task->setup_job = std::move(setup_job);
  task->order = std::move(order);
  std::weak_ptr<Task> weak = task;
  task->reactor = new CancellableReactor([this, weak] {
    std::shared_ptr<Task> t = weak.lock();
    if (t == nullptr) return;
    t->cancelled = true;
    t->canceller->Cancel();
    bool was_held = false;
    {
      absl::MutexLock lock(&mu_);
      if (running_ == t && job_ != nullptr) job_->Cancel();
      auto held = std::find(held_.begin(), held_.end(), t);
      if (held != held_.end()) {
        held_.erase(held);
        was_held = true;
      }
    }
    // A held call is in no queue: nothing else will answer it.
    if (was_held) t->reactor->Finish(ToGrpcStatus(absl::CancelledError("the call was cancelled")));
  });
  grpc::ServerUnaryReactor* reactor = task->reactor;
  if (absl::Status s = CheckBearerToken(*context, options_.token); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    reactor->Finish(ToGrpcStatus(absl::UnavailableError("the worker is shutting down")));
    return reactor;
  }
  // Decided here, with the queueing: a Setup taken before a drain began runs, so its job counts
  // as this worker's and its coordinator checkpoints it and lets the worker go.
  if (leaving_ && !task->setup_job.empty()) {
    reactor->Finish(ToGrpcStatus(
        absl::UnavailableError(absl::StrCat("worker '", options_.identity.name,
                                            "' is stopping (draining) and takes no new job; "
                                            "place the job on another worker"))));
    return reactor;
  }
  if (absl::Status room = QueueRoomLocked(); !room.ok()) {
    reactor->Finish(ToGrpcStatus(room));
    return reactor;
  }
  QueueInOrder(std::move(task));
  return reactor;
}

absl::Status WorkerService::QueueRoomLocked() const {
  // Each waiting call keeps its request (up to kMaxMessageBytes) alive: a coordinator sends a
  // few at a time, so a long queue is a client that does not wait for its answers.
  if (queue_.size() < kMostQueued) return absl::OkStatus();
  // The job here is whose coordinator most likely sent them: the one to look at.
  const std::string current = CurrentJobLocked();
  const std::string job =
      current.empty() ? "" : absl::StrCat(" (this worker's job is '", current, "')");
  return absl::ResourceExhaustedError(absl::StrCat(
      "worker '", options_.identity.name, "' has ", queue_.size(),
      " calls waiting for its executor", job, "; wait for their answers before sending more"));
}

void WorkerService::ExecutorLoop() {
  // libtorch's thread count is OpenMP's, which is per thread: the daemon's main set it for
  // itself, and this thread (where every step runs) starts from OpenMP's default of one per
  // core. Without this, two workers on a 2-core machine ran 4 compute threads and trained at
  // half the speed of two 1-thread loops (oneDNN and OpenBLAS both follow OpenMP).
  SetComputeThreads(options_.identity.threads);
  // Before the first step: the OpenMP threads a step starts inherit this mask.
  if (absl::Status pinned = PinCurrentThread(options_.identity.cpus); !pinned.ok()) {
    LogWarning(absl::StrCat("steps run unpinned: ", pinned.message()));
  }
  bool purge_warned = false;
  while (true) {
    std::shared_ptr<Task> task;
    std::optional<CpuPlacement> place;
    const absl::Time next_expiry = ExpireHeld();
    {
      absl::MutexLock lock(&mu_);
      const bool woken =
          mu_.AwaitWithDeadline(absl::Condition(
                                    +[](WorkerService* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                                      return s->stop_ || !s->queue_.empty() || s->held_added_;
                                    },
                                    this),
                                next_expiry);
      held_added_ = false;
      // A held call's wait is over, or a new one is held: the next expiry is worked out again.
      if (!woken || (queue_.empty() && !stop_)) continue;
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = task;
      if (offered_placement_.has_value() && job_ == nullptr) {
        place = std::move(offered_placement_);
        offered_placement_.reset();
      }
    }
    if (place.has_value()) ApplyPlacement(*place);
    absl::Status status = absl::OkStatus();
    if (task->cancelled) {
      status = absl::CancelledError("the call was cancelled before it ran");
    } else if (absl::Status follows = CheckFollows(*task); !follows.ok()) {
      status = std::move(follows);
    } else {
      status = task->body();
    }
    {
      absl::MutexLock lock(&mu_);
      running_.reset();
      NoteRan(*task, status);
      // A call the hard stop cut short is this worker leaving, not a client's cancellation: the
      // coordinator must name this worker as the one its job lost.
      if (stopping_ && status.code() == absl::StatusCode::kCancelled) {
        status = absl::UnavailableError(
            "the worker is shutting down and stopped this call before it finished");
      }
    }
    // Internal tasks (AbandonJob) have no RPC to answer.
    if (task->reactor != nullptr) task->reactor->Finish(ToGrpcStatus(status));
    if (task->answer) task->answer(status);
    task.reset();
    // Without a job (torn down, failed, a dry run or a refused Setup) nothing reuses soon the
    // pages the last task freed, and the allocator keeps them until told (worker_allocator.h).
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      idle = job_ == nullptr && !stopping_;
    }
    if (idle) {
      // Once: a purge that fails once fails after every idle task, and the log would fill.
      if (absl::Status returned = ReturnFreedMemory(); !returned.ok() && !purge_warned) {
        LogWarning(
            absl::StrCat("freed memory stays with the worker between jobs: ", returned.message()));
        purge_warned = true;
      }
    }
  }
}

void WorkerService::ApplyPlacement(const CpuPlacement& placement) {
  if (absl::Status moved =
          MoveComputeThreads(placement.cpus, options_.allowed_cpus, placement.threads);
      !moved.ok()) {
    LogWarning(absl::StrCat("steps stay where they were: ", moved.message()));
    return;
  }
  identity_.cpus = placement.cpus;
  identity_.threads = placement.threads;
  {
    absl::MutexLock lock(&mu_);
    placed_ = {FormatCpuList(placement.cpus), placement.threads};
  }
  const std::string cpus = placement.cpus.empty() ? "unpinned" : FormatCpuList(placement.cpus);
  const std::string threads = absl::StrCat(placement.threads);
  if (placement.shared) {
    LogWarning(absl::StrCat("steps placed: ", placement.reason,
                            "; steps that share cores trained the zoo's MLP 13% slower "
                            "(docs/OPERATIONS.md, \"Cores\")"),
               {{"cpus", cpus}, {"threads", threads}});
  } else {
    LogInfo(absl::StrCat("steps placed: ", placement.reason),
            {{"cpus", cpus}, {"threads", threads}});
  }
}

void WorkerService::OfferPlacement(CpuPlacement placement) {
  absl::MutexLock lock(&mu_);
  if (placed_ == std::make_pair(FormatCpuList(placement.cpus), placement.threads)) {
    offered_placement_.reset();  // back where it is: an earlier offer is moot
    return;
  }
  offered_placement_ = std::move(placement);
  if (stopping_ || job_ != nullptr) return;  // the next Setup applies it
  // Idle: an internal task applies it now, so the log and heartbeats show it at once.
  auto task = std::make_shared<Task>();
  task->body = [] { return absl::OkStatus(); };
  queue_.push_back(std::move(task));
}

std::pair<std::string, int> WorkerService::placement() const {
  absl::MutexLock lock(&mu_);
  return placed_;
}

absl::StatusOr<std::shared_ptr<HostedJob>> WorkerService::JobFor(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (job_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no job is set up on worker '", options_.identity.name, "'; call Setup first"));
  }
  if (job_->id() != job_id) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", options_.identity.name,
                                                      "' is set up for job '", job_->id(),
                                                      "', not '", job_id, "'"));
  }
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' failed on this worker (",
                                                      last_error_, "); call Teardown"));
  }
  return job_;
}

absl::Status WorkerService::Note(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok()) last_error_ = std::string(status.message());
  // After such an error the job's group is gone: a rank died, hung or the coordinator left.
  if (IsLostPeerError(status)) failed_ = true;
  return status;
}

grpc::ServerUnaryReactor* WorkerService::Setup(grpc::CallbackServerContext* context,
                                               const v1::SetupRequest* request,
                                               v1::SetupResponse* response) {
  // The id is checked before queueing: while the Setup waits, heartbeats report it.
  if (absl::Status s = CheckBearerToken(*context, options_.token); !s.ok()) {
    return FinishNow(context, s);
  }
  if (absl::Status s = CheckJobId(request->job_id()); !s.ok()) return FinishNow(context, s);
  // A Setup waits for its group; the coordinator cancelling the call (the job was cancelled,
  // another rank failed) or tearing the job down ends that wait instead of holding this worker.
  auto canceller = std::make_shared<CallCanceller>();
  return Enqueue(
      context,
      [this, request, response, canceller]() -> absl::Status {
        {
          absl::MutexLock lock(&mu_);
          if (job_ != nullptr) {
            return absl::FailedPreconditionError(absl::StrCat("worker '", options_.identity.name,
                                                              "' already runs job '", job_->id(),
                                                              "'; call Teardown first"));
          }
        }
        // Files the job names by content come from the coordinator (or this worker's cache);
        // the ranks, ddp_spawn children included, read the local copy.
        v1::SetupRequest local = *request;
        DTRAIN_RETURN_IF_ERROR(PrepareSetup(&local, options_.identity.devices, options_.artifacts));
        const bool store = local.store_checkpoints();
        DTRAIN_ASSIGN_OR_RETURN(std::string checkpoint_dir, CheckpointDirectory(&local));
        const v1::SetupRequest* request = &local;
        absl::StatusOr<PluginRegistry::StrategyEntry> strategy =
            ResolveStrategy(request->spec().trainer().strategy());
        absl::StatusOr<std::unique_ptr<HostedJob>> job;
        if (strategy.ok() && strategy->traits.spawns_per_device) {
          if (options_.spawn_binary.empty()) {
            return absl::FailedPreconditionError(
                "ddp_spawn is not available in a spawned child; use ddp");
          }
          job = SpawnedJob::Setup(*request, identity_, options_.spawn_binary,
                                  ChildMode::kOnePerDevice, response, canceller.get());
        } else if (options_.isolate_ranks) {
          job = SpawnedJob::Setup(*request, identity_, options_.spawn_binary, ChildMode::kWholeJob,
                                  response, canceller.get());
        } else {
          job = SetupLocalJob(*request, identity_, response, canceller.get());
        }
        if (!job.ok()) return Note(job.status());
        absl::MutexLock lock(&mu_);
        job_ = std::move(*job);
        failed_ = false;
        last_error_.clear();
        checkpoint_dir_ = std::move(checkpoint_dir);
        store_checkpoints_ = store;
        return absl::OkStatus();
      },
      request->job_id(), canceller);
}

absl::Status WorkerService::RunStep(StepKind kind, const v1::StepRequest& request,
                                    v1::StepResponse* response) {
  DTRAIN_RETURN_IF_ERROR(CheckNames("monitored", request.monitored()));
  DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<HostedJob> job, JobFor(request.job_id()));
  const absl::Time start = absl::Now();
  absl::Status status = job->Step(kind, request, response);
  if (status.ok() &&
      response->ByteSizeLong() > static_cast<size_t>(kDefaultClientMaxMessageBytes)) {
    // Loud, not a message some clients cannot read: fewer batches per call make it smaller.
    status = absl::FailedPreconditionError(absl::StrCat(
        "the step's outputs are ", response->ByteSizeLong(),
        " bytes, more than one 4 MiB response; send fewer batches per call (the job spec's "
        "trainer.batches_per_call, or a smaller data.eval_batch_size)"));
    response->Clear();
  }
  if (options_.metrics != nullptr) {
    static constexpr const char* kNames[] = {"training", "validation", "test", "predict"};
    const std::string name = kNames[static_cast<int>(kind)];
    int64_t batches = 0;
    // Only a call that ran: a refused one's count is the caller's claim (LocalWork.sampled).
    if (status.ok()) {
      for (const v1::LocalWork& work : request.work()) batches += LocalWorkBatches(work);
    }
    options_.metrics->Increment("dtrain_worker_step_calls_total",
                                {{"kind", name}, {"outcome", status.ok() ? "ok" : "error"}});
    options_.metrics->Increment("dtrain_worker_batches_total", {{"kind", name}},
                                static_cast<double>(batches));
    options_.metrics->Observe("dtrain_worker_step_call_seconds", {{"kind", name}},
                              absl::ToDoubleSeconds(absl::Now() - start));
  }
  return Note(status);
}

grpc::ServerUnaryReactor* WorkerService::TrainingStep(grpc::CallbackServerContext* context,
                                                      const v1::StepRequest* request,
                                                      v1::StepResponse* response) {
  absl::StatusOr<WorkerTrainOrder> order = TrainOrderOf(*request);
  if (!order.ok()) {
    const absl::Status token = CheckBearerToken(*context, options_.token);
    return FinishNow(context, token.ok() ? order.status() : token);
  }
  return Enqueue(
      context, [=] { return RunStep(StepKind::kTraining, *request, response); }, "", nullptr,
      *std::move(order));
}
grpc::ServerUnaryReactor* WorkerService::ValidationStep(grpc::CallbackServerContext* context,
                                                        const v1::StepRequest* request,
                                                        v1::StepResponse* response) {
  return Enqueue(context, [=] { return RunStep(StepKind::kValidation, *request, response); });
}
grpc::ServerUnaryReactor* WorkerService::TestStep(grpc::CallbackServerContext* context,
                                                  const v1::StepRequest* request,
                                                  v1::StepResponse* response) {
  return Enqueue(context, [=] { return RunStep(StepKind::kTest, *request, response); });
}
grpc::ServerUnaryReactor* WorkerService::PredictStep(grpc::CallbackServerContext* context,
                                                     const v1::StepRequest* request,
                                                     v1::StepResponse* response) {
  return Enqueue(context, [=] { return RunStep(StepKind::kPredict, *request, response); });
}

grpc::ServerWriteReactor<v1::StateDictChunk>* WorkerService::StreamStateDict(
    grpc::CallbackServerContext* context, const v1::StateDictRequest* request) {
  auto* writer = new StateDictWriter();
  if (absl::Status s = CheckBearerToken(*context, options_.token); !s.ok()) {
    writer->Fail(s);
    return writer;
  }
  auto task = std::make_shared<Task>();
  task->body = [this, writer, job_id = request->job_id()]() -> absl::Status {
    DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<HostedJob> job, JobFor(job_id));
    v1::StateDictResponse dict;
    DTRAIN_RETURN_IF_ERROR(job->StateDict(&dict));
    writer->Start(StateDictChunks(dict));
    return absl::OkStatus();
  };
  // A body that failed, or was cancelled before it ran, answers here.
  task->answer = [writer](const absl::Status& status) {
    if (!status.ok()) writer->Fail(status);
  };
  task->order.neutral = true;
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    writer->Fail(absl::UnavailableError("the worker is shutting down"));
    return writer;
  }
  if (absl::Status room = QueueRoomLocked(); !room.ok()) {
    writer->Fail(room);
    return writer;
  }
  queue_.push_back(std::move(task));
  return writer;
}

grpc::ServerUnaryReactor* WorkerService::ReduceBooleanDecision(grpc::CallbackServerContext* context,
                                                               const v1::DecisionRequest* request,
                                                               v1::DecisionResponse* response) {
  return Enqueue(context, [=]() -> absl::Status {
    DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<HostedJob> job, JobFor(request->job_id()));
    return Note(job->ReduceBooleanDecision(*request, response));
  });
}

absl::Status WorkerService::TeardownJob(bool all_ranks) {
  std::shared_ptr<HostedJob> job;
  {
    absl::MutexLock lock(&mu_);
    job = job_;
  }
  if (job == nullptr) return absl::OkStatus();
  // Leaving may fail when the group is already gone; the job is released either way.
  job->Teardown(all_ranks).IgnoreError();
  std::vector<std::shared_ptr<Task>> dropped;
  {
    absl::MutexLock lock(&mu_);
    // This worker's own files of the job went to the coordinator; what is left is scratch.
    if (store_checkpoints_) {
      // Only ever the job's own directory inside jobs_dir (CheckJobId refused the ids that are
      // not; checked again here, where a mistake would remove more).
      std::filesystem::path jobs = std::filesystem::path(options_.jobs_dir).lexically_normal();
      if (jobs.filename().empty()) jobs = jobs.parent_path();
      const std::filesystem::path dir = (jobs / job->id()).lexically_normal();
      std::error_code error;
      if (dir.parent_path() == jobs && dir.filename() == job->id()) {
        std::filesystem::remove_all(dir, error);
      }
    }
    job_.reset();
    failed_ = false;
    train_queued_end_.reset();
    train_done_end_.reset();
    // Its held calls will never run: answered now rather than at the end of their hold.
    dropped = TakeHeld(job->id());
    checkpoint_dir_.clear();
    store_checkpoints_ = false;
  }
  for (const std::shared_ptr<Task>& t : dropped) {
    t->reactor->Finish(ToGrpcStatus(absl::CancelledError(absl::StrCat(
        "job '", job->id(), "' was torn down before the training call this one follows came"))));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* WorkerService::Teardown(grpc::CallbackServerContext* context,
                                                  const v1::TeardownRequest* request,
                                                  v1::TeardownResponse* response) {
  if (absl::Status s = CheckBearerToken(*context, options_.token); !s.ok()) {
    return FinishNow(context, s);
  }
  {
    // Stop a running step now rather than after its last batch.
    absl::MutexLock lock(&mu_);
    if (job_ != nullptr && (request->job_id().empty() || request->job_id() == job_->id())) {
      job_->Cancel();
    }
    // A Setup of this job still waiting for its group: it will not form now.
    if (running_ != nullptr && !running_->setup_job.empty() &&
        (request->job_id().empty() || request->job_id() == running_->setup_job)) {
      running_->canceller->Cancel();
    }
  }
  return Enqueue(context, [=]() -> absl::Status {
    {
      absl::MutexLock lock(&mu_);
      if (job_ == nullptr) return absl::OkStatus();  // idempotent
      if (!request->job_id().empty() && request->job_id() != job_->id()) {
        return absl::FailedPreconditionError(absl::StrCat("worker '", options_.identity.name,
                                                          "' runs job '", job_->id(), "', not '",
                                                          request->job_id(), "'"));
      }
    }
    return TeardownJob(request->all_ranks());
  });
}

grpc::ServerUnaryReactor* WorkerService::DryRun(grpc::CallbackServerContext* context,
                                                const v1::DryRunRequest* request,
                                                v1::DryRunResponse* response) {
  // A child's dry run ends by the caller's deadline (at most 30 minutes), so that a hung one
  // cannot hold this worker's queue.
  const absl::Time deadline =
      std::min(absl::FromChrono(context->deadline()), absl::Now() + absl::Minutes(30));
  // Queued like a step, so it never runs beside this worker's job.
  auto dry_run = [this, request, response, deadline]() -> absl::Status {
    v1::DryRunRequest local = *request;
    DTRAIN_RETURN_IF_ERROR(
        PrepareSetup(local.mutable_setup(), options_.identity.devices, options_.artifacts));
    // The model's code runs in a child when ranks are isolated, as a job's would.
    absl::StatusOr<v1::DryRunResponse> report =
        options_.isolate_ranks
            ? SpawnedJob::DryRun(local, identity_, options_.spawn_binary, deadline)
            : Job::DryRun(local, identity_);
    if (!report.ok()) return report.status();
    *response = std::move(*report);
    return absl::OkStatus();
  };
  WorkerTrainOrder neutral;
  neutral.neutral = true;  // another model's: this worker's job is untouched
  return Enqueue(context, std::move(dry_run), "", nullptr, std::move(neutral));
}

grpc::ServerUnaryReactor* WorkerService::Health(grpc::CallbackServerContext* context,
                                                const v1::HealthRequest* request,
                                                v1::HealthResponse* response) {
  if (absl::Status s = CheckBearerToken(*context, options_.token); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::MutexLock lock(&mu_);
  response->set_worker_name(options_.identity.name);
  response->set_devices(options_.identity.devices);
  response->set_last_error(last_error_);
  if (job_ == nullptr) {
    response->set_state(v1::HealthResponse::IDLE);
  } else {
    response->set_job_id(job_->id());
    response->set_local_processes(job_->local_processes());
    response->set_state(failed_               ? v1::HealthResponse::FAILED
                        : running_ != nullptr ? v1::HealthResponse::BUSY
                                              : v1::HealthResponse::READY);
  }
  return FinishNow(context, absl::OkStatus());
}

void WorkerService::Drain() {
  absl::MutexLock lock(&mu_);
  leaving_ = true;
}

bool WorkerService::Idle() const { return queue_.empty() && held_.empty() && running_ == nullptr; }

bool WorkerService::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(this, &WorkerService::Idle), deadline);
}

absl::Status WorkerService::StopNow(absl::Duration wait) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      // Another call stops the service (or did): its outcome is this one's.
      if (!mu_.AwaitWithTimeout(absl::Condition(
                                    +[](WorkerService* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                                      return s->stopped_.has_value();
                                    },
                                    this),
                                wait)) {
        return absl::DeadlineExceededError("the worker's stop, begun by another caller, goes on");
      }
      return *stopped_;
    }
    stopping_ = leaving_ = true;
    if (job_ != nullptr) job_->Cancel();
    if (running_ != nullptr) running_->canceller->Cancel();
    // Queued calls will not run: answer them now (held ones below).
    for (std::shared_ptr<Task>& t : queue_) t->cancelled = true;
  }
  ExpireHeld();
  {
    absl::MutexLock lock(&mu_);
    // Wait for the executor to go idle (every plane ends a collective's wait when the job is
    // cancelled, and a step stops before its next batch), then tear down on this thread.
    const bool idle = mu_.AwaitWithTimeout(absl::Condition(this, &WorkerService::Idle), wait);
    if (!idle) {
      std::string job = job_ != nullptr ? job_->id() : "";
      if (job.empty() && running_ != nullptr) job = running_->setup_job;
      stopped_ = absl::DeadlineExceededError(absl::StrCat(
          "the running call", job.empty() ? "" : absl::StrCat(" of job '", job, "'"),
          " did not stop within ", absl::FormatDuration(wait),
          " of being cancelled (a kernel or a library call that does not return); leaving "
          "without tearing the job down: its group sees this worker die"));
      return *stopped_;
    }
  }
  TeardownJob().IgnoreError();
  absl::MutexLock lock(&mu_);
  stopped_ = absl::OkStatus();
  return *stopped_;
}

void WorkerService::AbandonJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  // A Setup of the ended job still waiting for its group.
  if (running_ != nullptr && running_->setup_job == job_id) running_->canceller->Cancel();
  if (job_ == nullptr || job_->id() != job_id || stopping_) return;
  job_->Cancel();
  auto task = std::make_shared<Task>();
  task->body = [this, job_id]() -> absl::Status {
    {
      absl::MutexLock lock(&mu_);
      if (job_ == nullptr || job_->id() != job_id) return absl::OkStatus();
    }
    LogWarning(absl::StrCat("job '", job_id,
                            "' ended while this worker was unreachable; "
                            "tearing it down"),
               {{"job", job_id}});
    return TeardownJob();
  };
  queue_.push_back(std::move(task));
}

std::string WorkerService::current_job() const {
  absl::MutexLock lock(&mu_);
  return CurrentJobLocked();
}

std::string WorkerService::CurrentJobLocked() const {
  if (job_ != nullptr) return job_->id();
  if (running_ != nullptr && !running_->setup_job.empty()) return running_->setup_job;
  for (const std::shared_ptr<Task>& t : queue_) {
    if (!t->setup_job.empty() && !t->cancelled) return t->setup_job;
  }
  return "";
}

}  // namespace dtrain

// The Worker gRPC service (proto/dtrain/v1/worker.proto) on the callback API. Job RPCs run one
// at a time on one executor thread, in arrival order, so a step never races a teardown and the
// gRPC threads never block on libtorch; Health answers at once. A cancelled step RPC stops its
// step before the next batch. libtorch's errors come back as statuses and the service keeps
// serving: whatever a request does, the next Setup starts afresh.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/call_canceller.h"
#include "common/metrics_registry.h"
#include "dtrain/v1/worker.grpc.pb.h"
#include "worker/runtime/cpu_placement.h"
#include "worker/runtime/hosted_job.h"
#include "worker/runtime/worker_identity.h"
#include "worker/service/artifact_cache.h"
#include "worker/service/training_call_order.h"

namespace dtrain {

struct WorkerServiceOptions {
  WorkerIdentity identity;
  // The cores this process may use: where an unpinned placement puts the step thread back.
  std::vector<int> allowed_cpus;
  // This program, run with --child by ddp_spawn; empty disables ddp_spawn.
  std::string spawn_binary;
  // Runs every job in a child process of spawn_binary (WorkerServerOptions::isolate_ranks).
  bool isolate_ranks = false;
  // The bearer token every call must present; empty: none required.
  std::string token;
  // Where step counts and latencies go (must outlive the service); null: nowhere.
  MetricsRegistry* metrics = nullptr;
  // Resolves the spec's "artifact:" and "worker:" paths (must outlive the service); null:
  // paths are used as written and an "artifact:" path is refused.
  ArtifactCache* artifacts = nullptr;
  // Where this worker keeps each job's own files (<jobs_dir>/<job id>/checkpoints), removed at
  // Teardown; empty: jobs that ask to store their checkpoints on the coordinator are refused.
  std::string jobs_dir;
  // Sends a file to the coordinator's store and returns its digest ("sha256:<hex>");
  // ArtifactsClient::Upload in production. Null: as an empty jobs_dir.
  std::function<absl::StatusOr<std::string>(const std::string& path)> store_file;
};

class WorkerService final : public v1::Worker::CallbackService {
 public:
  explicit WorkerService(WorkerServiceOptions options);
  // Stops (see StopNow) and stops the executor.
  ~WorkerService() override;

  grpc::ServerUnaryReactor* Setup(grpc::CallbackServerContext* context,
                                  const v1::SetupRequest* request,
                                  v1::SetupResponse* response) override;
  grpc::ServerUnaryReactor* TrainingStep(grpc::CallbackServerContext* context,
                                         const v1::StepRequest* request,
                                         v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* ValidationStep(grpc::CallbackServerContext* context,
                                           const v1::StepRequest* request,
                                           v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* TestStep(grpc::CallbackServerContext* context,
                                     const v1::StepRequest* request,
                                     v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* PredictStep(grpc::CallbackServerContext* context,
                                        const v1::StepRequest* request,
                                        v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* context,
                                           const v1::SaveCheckpointRequest* request,
                                           v1::SaveCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* LoadCheckpoint(grpc::CallbackServerContext* context,
                                           const v1::LoadCheckpointRequest* request,
                                           v1::LoadCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* StateDict(grpc::CallbackServerContext* context,
                                      const v1::StateDictRequest* request,
                                      v1::StateDictResponse* response) override;
  grpc::ServerUnaryReactor* ReduceBooleanDecision(grpc::CallbackServerContext* context,
                                                  const v1::DecisionRequest* request,
                                                  v1::DecisionResponse* response) override;
  grpc::ServerUnaryReactor* Teardown(grpc::CallbackServerContext* context,
                                     const v1::TeardownRequest* request,
                                     v1::TeardownResponse* response) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;
  grpc::ServerWriteReactor<v1::StateDictChunk>* StreamStateDict(
      grpc::CallbackServerContext* context, const v1::StateDictRequest* request) override;
  grpc::ServerUnaryReactor* DryRun(grpc::CallbackServerContext* context,
                                   const v1::DryRunRequest* request,
                                   v1::DryRunResponse* response) override;

  // The start of a graceful stop: Setup is refused (UNAVAILABLE) from now on, while the job set
  // up keeps running, so its step finishes and its coordinator can checkpoint and release it.
  void Drain();
  // Blocks until no call runs or waits (the current step is done), or `deadline`; true if idle.
  bool WaitUntilIdle(absl::Time deadline);
  // The hard stop, after Drain's grace (or at once): refuses every job RPC (UNAVAILABLE),
  // stops the running step before its next batch (a collective it waits in ends at once), and
  // tears the job down so that it leaves its group cleanly. Returns once done, or with
  // DEADLINE_EXCEEDED naming the job when the running call has not stopped within `wait` (a
  // kernel that never returns): the job is then not torn down, and the caller should exit
  // without destroying this service. Idempotent: later calls return the first one's outcome.
  absl::Status StopNow(absl::Duration wait = kStopWait);
  static constexpr absl::Duration kStopWait = absl::Seconds(30);
  // The job set up now, or whose Setup was taken and has not ended; or "".
  std::string current_job() const;
  // A new place for the steps (--cpus=auto: another worker of this host came or went). Applied
  // on the step thread before the next job is set up, never under a job; the latest offer wins.
  void OfferPlacement(CpuPlacement placement);
  // Where steps run now, for heartbeats: the cores ("" when not pinned) and compute threads.
  std::pair<std::string, int> placement() const;
  // The coordinator no longer counts `job_id` as this worker's (it ended while this worker was
  // unreachable or stopped): stops it and tears it down on the executor. Does not block.
  void AbandonJob(const std::string& job_id);

 private:
  // One queued call: its body and how it is answered.
  struct Task {
    std::function<absl::Status()> body;
    grpc::ServerUnaryReactor* reactor = nullptr;
    std::atomic<bool> cancelled{false};
    std::string setup_job;  // a Setup's job id
    // Cancels a Setup's wait for its group when the call is cancelled or its job torn down.
    std::shared_ptr<CallCanceller> canceller = std::make_shared<CallCanceller>();
    // For a call answered by other means than `reactor` (a stream): gets the outcome when the
    // body failed or never ran.
    std::function<void(const absl::Status&)> answer;
    WorkerTrainOrder order;  // a training call's
    absl::Time held_until = absl::InfiniteFuture();
  };
  // A pipelined call waits at most this long for the call before it to arrive.
  static constexpr absl::Duration kPipelinedHold = absl::Seconds(30);
  static constexpr size_t kMostHeld = 8;
  // Calls queued for the executor, beyond which a new one is RESOURCE_EXHAUSTED. A training
  // call let in may release up to kMostHeld held ones behind it (already counted there), so the
  // queue holds at most kMostQueued + kMostHeld.
  static constexpr size_t kMostQueued = 64;
  // Where the Setup's job writes checkpoints on this worker ("" for none): the spec's (local)
  // checkpoint.dirpath, or, with store_checkpoints, this worker's own directory for the job,
  // which it sets as the dirpath the ranks see.
  absl::StatusOr<std::string> CheckpointDirectory(v1::SetupRequest* setup);
  // The Setup's checkpoint directory: where SaveCheckpoint writes and a bare name loads from.
  absl::StatusOr<std::string> CheckpointPath(const std::string& name, const std::string& field);
  // Queues `body` on the executor; the RPC finishes with its status. A step's cancellation
  // stops it (before its next batch) or, if it has not started, skips it.
  // `setup_job` marks a Setup: refused once draining, and its job counts as this worker's.
  grpc::ServerUnaryReactor* Enqueue(grpc::CallbackServerContext* context,
                                    std::function<absl::Status()> body, std::string setup_job = "",
                                    std::shared_ptr<CallCanceller> canceller = nullptr,
                                    WorkerTrainOrder order = {});
  // The training calls' order (worker_service_training_order.cc). Queues `task`, or holds a
  // pipelined call whose predecessor has not arrived (answering it when too many are held);
  // a training call queued releases the call held for it.
  void QueueInOrder(std::shared_ptr<Task> task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when kMostQueued calls already wait for the executor.
  absl::Status QueueRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string CurrentJobLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // current_job()'s
  void Queue(std::shared_ptr<Task> task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the held calls whose hold is over (all of them when stopping); returns when the
  // next one's is.
  absl::Time ExpireHeld();
  // On the executor, before `task` runs: FAILED_PRECONDITION for a pipelined call that does not
  // follow the call that ran last; after it: what it leaves for the next one to follow.
  absl::Status CheckFollows(const Task& task);
  void NoteRan(const Task& task, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the held calls of `job` (torn down) out, for the caller to answer.
  std::vector<std::shared_ptr<Task>> TakeHeld(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExecutorLoop();
  // No call queued, held or running: what a drain and a stop wait for.
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On the step thread, with no job set up.
  void ApplyPlacement(const CpuPlacement& placement);
  // Runs on the executor: the job named `job_id` or FAILED_PRECONDITION.
  absl::StatusOr<std::shared_ptr<HostedJob>> JobFor(const std::string& job_id);
  absl::Status RunStep(StepKind kind, const v1::StepRequest& request, v1::StepResponse* response);
  // Records a collective failure: the job is over until it is torn down.
  absl::Status Note(absl::Status status);
  // `all_ranks`: the coordinator tears every rank down at once (TeardownRequest.all_ranks).
  absl::Status TeardownJob(bool all_ranks = false);

  const WorkerServiceOptions options_;
  // options_.identity with the placement of now (cpus, threads): read and changed on the step
  // thread only, which sets jobs up.
  WorkerIdentity identity_;
  mutable absl::Mutex mu_;
  std::optional<CpuPlacement> offered_placement_ ABSL_GUARDED_BY(mu_);
  std::pair<std::string, int> placed_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<HostedJob> job_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Task>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Task> running_ ABSL_GUARDED_BY(mu_);
  // Pipelined training calls that arrived before the call they follow (gRPC may hand two calls
  // to handlers in either order); where the last training call queued ends, and where the last
  // one that succeeded does.
  std::vector<std::shared_ptr<Task>> held_ ABSL_GUARDED_BY(mu_);
  bool held_added_ ABSL_GUARDED_BY(mu_) = false;  // wakes the executor to time the new hold
  std::optional<WorkerTrainPoint> train_queued_end_ ABSL_GUARDED_BY(mu_);
  std::optional<WorkerTrainPoint> train_done_end_ ABSL_GUARDED_BY(mu_);
  // Whether the last call that is not neutral failed, for CheckFollows to say why a pipelined
  // call may not run: its predecessor failed, or another call ran between the two.
  bool last_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;                 // Drain: no new job
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;                // StopNow: no call at all
  std::optional<absl::Status> stopped_ ABSL_GUARDED_BY(mu_);  // StopNow's outcome, once known
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  // The job's checkpoint directory on this worker, and whether its checkpoints go to the
  // coordinator's store (then the directory is this worker's own, under jobs_dir).
  std::string checkpoint_dir_ ABSL_GUARDED_BY(mu_);
  bool store_checkpoints_ ABSL_GUARDED_BY(mu_) = false;
  std::thread executor_;
};

}  // namespace dtrain

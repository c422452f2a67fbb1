// A job's ranks in child processes: for ddp_spawn the worker daemon spawns one child per local
// device, each a rank of its own (local rank = its index); with rank isolation (the worker's
// --rank_isolation) one child hosts the whole job, so that model code never runs in the
// process that holds the worker's token. The daemon forwards every job RPC to them over the
// Worker service on 127.0.0.1. Children are this same binary in --child mode; they die with
// their parent (PR_SET_PDEATHSIG) and are always reaped. A child that exits fails the job with
// its exit status, reported by local rank and pid.
//
// A child's environment carries the job's token (DTRAIN_TOKEN) in place of the daemon's, and a
// secret of the job's own (DTRAIN_CHILD_SECRET) that the daemon presents on every call to it.
// The daemon's token file (WorkerIdentity::hidden_files) is covered by an empty file in the
// child's own mount namespace.
//
// Thread-safety: one call at a time, except Cancel.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/call_canceller.h"
#include "common/parallel_calls.h"
#include "dtrain/v1/worker.grpc.pb.h"
#include "worker/runtime/hosted_job.h"
#include "worker/runtime/job.h"

namespace dtrain {

enum class ChildMode {
  kOnePerDevice,  // ddp_spawn
  kWholeJob,      // rank isolation: the request as it is, in one child
};

class SpawnedJob : public HostedJob {
 public:
  // kOnePerDevice: spawns spec.trainer.devices children of `binary` (the request as the service
  // prepared it) and sets each up with the same request as one ddp rank of one device.
  // kWholeJob: one child, set up with the request unchanged. Fills `response` with every
  // child's ranks.
  static absl::StatusOr<std::unique_ptr<HostedJob>> Setup(const v1::SetupRequest& request,
                                                          const WorkerIdentity& identity,
                                                          const std::string& binary, ChildMode mode,
                                                          v1::SetupResponse* response,
                                                          CallCanceller* cancel = nullptr);
  // Runs the dry run `request` names in one child of `binary`, which is stopped afterwards:
  // the model's code never runs in the daemon's process. DEADLINE_EXCEEDED past `deadline`
  // (the caller's).
  static absl::StatusOr<v1::DryRunResponse> DryRun(const v1::DryRunRequest& request,
                                                   const WorkerIdentity& identity,
                                                   const std::string& binary, absl::Time deadline);
  ~SpawnedJob() override;

  const std::string& id() const override { return id_; }
  int local_processes() const override { return static_cast<int>(children_.size()); }
  absl::Status Step(StepKind kind, const v1::StepRequest& request,
                    v1::StepResponse* response) override;
  absl::Status SaveCheckpoint(const std::string& path, const v1::SaveCheckpointRequest& request,
                              v1::SaveCheckpointResponse* response) override;
  absl::Status LoadCheckpoint(const v1::LoadCheckpointRequest& request,
                              v1::LoadCheckpointResponse* response) override;
  absl::Status StateDict(v1::StateDictResponse* response) override;
  absl::Status ReduceBooleanDecision(const v1::DecisionRequest& request,
                                     v1::DecisionResponse* response) override;
  absl::Status Teardown(bool all_ranks) override;
  void Cancel() override;

 private:
  struct Child {
    pid_t pid = -1;
    std::unique_ptr<v1::Worker::Stub> stub;
    std::thread reaper;
    bool exited = false;  // guarded by mu_
    int wait_status = 0;  // guarded by mu_
  };
  SpawnedJob() = default;
  // Spawns `n` children (one per device when `per_device`, else one for the whole job), each
  // given `token` for the coordinator, and waits until each serves.
  static absl::StatusOr<std::unique_ptr<SpawnedJob>> StartChildren(const std::string& job_id,
                                                                   const std::string& token,
                                                                   const WorkerIdentity& identity,
                                                                   const std::string& binary, int n,
                                                                   bool per_device);

  // Runs call(i, context) for every child at once (ParallelCalls: a hung child cannot hold
  // the job). The first failure is returned, a dead child's exit status preferred.
  absl::Status ForEachChild(const std::function<grpc::Status(int, grpc::ClientContext*)>& call);
  // The first failure of `results` (one per child), a dead child's exit status preferred.
  absl::Status Outcome(const std::vector<grpc::Status>& results);
  // "local rank i (pid p) exited with ...", or empty while it runs.
  std::string ExitDescription(int i);
  void StopChildren();

  std::string id_;
  std::string what_;  // "ddp_spawn" or "rank child", for messages
  std::vector<std::unique_ptr<Child>> children_;
  absl::Mutex mu_;
  ParallelCalls calls_;
  bool stopped_ = false;
};

}  // namespace dtrain

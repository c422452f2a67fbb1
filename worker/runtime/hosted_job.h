// The job a worker daemon hosts, at the level of the Worker service's messages: either one rank
// in this process (LocalJob, over worker/runtime/job.h) or several ranks in spawned child processes
// (SpawnedJob, worker/runtime/spawned_job.h, for ddp_spawn). The service talks to this interface
// only.
//
// Thread-safety: one call at a time, except Cancel.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/call_canceller.h"
#include "dtrain/v1/worker.pb.h"
#include "worker/model/step_kind.h"

namespace dtrain {

class Job;
struct WorkerIdentity;

class HostedJob {
 public:
  virtual ~HostedJob() = default;
  virtual const std::string& id() const = 0;
  virtual int local_processes() const = 0;
  virtual absl::Status Step(StepKind kind, const v1::StepRequest& request,
                            v1::StepResponse* response) = 0;
  // Writes the checkpoint `request` names at `path` (the service resolved the name in the
  // job's directory); ranks in other processes resolve it themselves.
  virtual absl::Status SaveCheckpoint(const std::string& path,
                                      const v1::SaveCheckpointRequest& request,
                                      v1::SaveCheckpointResponse* response) = 0;
  virtual absl::Status LoadCheckpoint(const v1::LoadCheckpointRequest& request,
                                      v1::LoadCheckpointResponse* response) = 0;
  virtual absl::Status StateDict(v1::StateDictResponse* response) = 0;
  virtual absl::Status ReduceBooleanDecision(const v1::DecisionRequest& request,
                                             v1::DecisionResponse* response) = 0;
  // Leaves the group and releases everything; the object is done afterwards.
  // `all_ranks`: every rank is torn down at once, so the teardown barrier runs.
  virtual absl::Status Teardown(bool all_ranks) = 0;
  // Asks a running step to stop before its next batch.
  virtual void Cancel() = 0;
};

// A job id a Setup may carry: 1-128 letters, digits, '-', '_' or '.' (it names files and
// directories on the worker). Checked before the Setup is queued.
absl::Status CheckJobId(const std::string& id);

// Sets up one rank in this process; fills `response`.
// `cancel` (optional) ends its wait for the group (Job::Setup).
absl::StatusOr<std::unique_ptr<HostedJob>> SetupLocalJob(const v1::SetupRequest& request,
                                                         const WorkerIdentity& identity,
                                                         v1::SetupResponse* response,
                                                         CallCanceller* cancel = nullptr);

}  // namespace dtrain

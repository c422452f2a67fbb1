// WorkerDirectory: what the Coordinator service's worker RPCs (RegisterWorker, WorkerHeartbeat,
// UnregisterWorker, ListWorkers) are answered from. The process-group server forms groups and
// runs collectives but places no work, so it only forwards these calls; the job side's
// WorkerRegistry (coordinator/jobs/worker_registry.h) is the implementation. A process-group
// server without a job side passes none, and the calls answer UNIMPLEMENTED.
//
// Thread-safety: implementations are called from any gRPC thread.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dtrain/v1/coordinator.pb.h"

namespace dtrain {

class WorkerDirectory {
 public:
  virtual ~WorkerDirectory() = default;

  virtual absl::Status Register(const v1::WorkerInfo& worker, absl::Time now) = 0;
  virtual absl::Status Heartbeat(const v1::WorkerHeartbeatRequest& request, absl::Time now,
                                 v1::WorkerHeartbeatResponse* response) = 0;
  virtual absl::Status Unregister(const v1::UnregisterWorkerRequest& request) = 0;
  // By name, with state and last_seen_ms_ago as of `now`.
  virtual std::vector<v1::WorkerInfo> List(absl::Time now) const = 0;
  // How often workers heartbeat now, and how long a silent one stays ALIVE: both may grow with
  // the number of workers, so that their heartbeats stay within the coordinator's budget.
  virtual absl::Duration heartbeat_interval() const = 0;
  virtual absl::Duration heartbeat_timeout() const = 0;
};

}  // namespace dtrain

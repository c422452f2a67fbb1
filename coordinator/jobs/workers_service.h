// WorkersService: the gRPC edge of the WorkerRegistry (dtrain.v1.Workers, proto/dtrain/v1/
// workers.proto) on the callback API: worker daemons register, heartbeat and unregister; the CLI,
// the Python client and operators list them. Every call needs the admin token (the one worker
// daemons and the CLI carry); a job token is refused, so a job's ranks cannot pose as workers.
// The registry does the validation; this file translates its absl::Status into grpc::Status.
//
// Thread-safety: gRPC calls the handlers from any of its threads; each answers at once.
#pragma once

#include "coordinator/auth/access_control.h"
#include "coordinator/jobs/worker_registry.h"
#include "dtrain/v1/workers.grpc.pb.h"

namespace dtrain {

class WorkersService final : public v1::Workers::CallbackService {
 public:
  // The pointees must outlive the service.
  WorkersService(WorkerRegistry* workers, const AccessControl* access)
      : workers_(workers), access_(access) {}

  // Answers the heartbeat interval and timeout to use, even when the registration is refused.
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* WorkerHeartbeat(grpc::CallbackServerContext* context,
                                            const v1::WorkerHeartbeatRequest* request,
                                            v1::WorkerHeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterWorker(grpc::CallbackServerContext* context,
                                             const v1::UnregisterWorkerRequest* request,
                                             v1::UnregisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;

 private:
  WorkerRegistry* const workers_;
  const AccessControl* const access_;
};

}  // namespace dtrain

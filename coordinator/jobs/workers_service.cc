#include "coordinator/jobs/workers_service.h"

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/callback_reactors.h"
#include "common/key_page.h"
#include "common/streaming.h"

namespace dtrain {

grpc::ServerUnaryReactor* WorkersService::RegisterWorker(grpc::CallbackServerContext* context,
                                                         const v1::RegisterWorkerRequest* request,
                                                         v1::RegisterWorkerResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "RegisterWorker"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::Status status =
      workers_->Register(request->worker(), absl::Now(), response->mutable_same_host());
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(workers_->heartbeat_interval()));
  response->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(workers_->heartbeat_timeout()));
  return FinishNow(context, status);
}

grpc::ServerUnaryReactor* WorkersService::WorkerHeartbeat(grpc::CallbackServerContext* context,
                                                          const v1::WorkerHeartbeatRequest* request,
                                                          v1::WorkerHeartbeatResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "WorkerHeartbeat"); !s.ok()) {
    return FinishNow(context, s);
  }
  return FinishNow(context, workers_->Heartbeat(*request, absl::Now(), response));
}

grpc::ServerUnaryReactor* WorkersService::UnregisterWorker(
    grpc::CallbackServerContext* context, const v1::UnregisterWorkerRequest* request,
    v1::UnregisterWorkerResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "UnregisterWorker"); !s.ok()) {
    return FinishNow(context, s);
  }
  return FinishNow(context, workers_->Unregister(*request));
}

grpc::ServerUnaryReactor* WorkersService::ListWorkers(grpc::CallbackServerContext* context,
                                                      const v1::ListWorkersRequest* request,
                                                      v1::ListWorkersResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "ListWorkers"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::StatusOr<KeyPage> page =
      KeyPage::Parse(request->page_size(), request->page_token(), kStreamChunkBytes);
  if (!page.ok()) return FinishNow(context, page.status());
  for (v1::WorkerInfo& info : workers_->List(absl::Now(), &*page)) {
    *response->add_workers() = std::move(info);
  }
  response->set_next_page_token(page->next_page_token());
  return FinishNow(context, absl::OkStatus());
}

}  // namespace dtrain

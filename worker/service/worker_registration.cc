#include "worker/service/worker_registration.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/log.h"

namespace dtrain {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(5);
constexpr absl::Duration kMaxBackoff = absl::Seconds(10);

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
}

}  // namespace

WorkerRegistration::WorkerRegistration(const std::string& coordinator, v1::WorkerInfo self,
                                       Hooks hooks)
    : self_(std::move(self)),
      coordinator_(coordinator),
      hooks_(std::move(hooks)),
      stub_(v1::Workers::NewStub(ConnectToCoordinator(coordinator))) {
  thread_ = std::thread([this] { Loop(); });
}

WorkerRegistration::~WorkerRegistration() {
  stop_.Notify();
  thread_.join();
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::UnregisterWorkerRequest request;
  request.set_name(self_.name());
  request.set_incarnation(self_.incarnation());
  v1::UnregisterWorkerResponse response;
  stub_->UnregisterWorker(&context, request, &response);
}

bool WorkerRegistration::Register() {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::RegisterWorkerRequest request;
  *request.mutable_worker() = self_;
  if (hooks_.placement) {
    const auto [cpus, threads] = hooks_.placement();
    request.mutable_worker()->set_cpus(cpus);
    request.mutable_worker()->set_threads(threads);
  }
  v1::RegisterWorkerResponse response;
  grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      LogError(absl::StrCat("the coordinator refused the registration: ", status.error_message()),
               {{"coordinator", coordinator_}});
    } else if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      // Retried like an outage: the coordinator may be upgraded under a waiting worker.
      LogError(
          absl::StrCat("the coordinator does not serve ", v1::Workers::service_full_name(),
                       ": it is older than this worker; upgrade it (", status.error_message(), ")"),
          {{"coordinator", coordinator_}});
    }
    return false;
  }
  if (response.heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  LogInfo(absl::StrCat("registered as '", self_.name(), "' with the coordinator"),
          {{"worker", self_.name()}, {"address", self_.address()}, {"coordinator", coordinator_}});
  if (hooks_.same_host) hooks_.same_host(response.same_host());
  return true;
}

grpc::Status WorkerRegistration::Heartbeat(v1::WorkerHeartbeatResponse* response) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::WorkerHeartbeatRequest request;
  request.set_name(self_.name());
  request.set_incarnation(self_.incarnation());
  request.set_job_id(hooks_.current_job());
  request.set_draining(draining_);
  if (hooks_.placement) {
    const auto [cpus, threads] = hooks_.placement();
    request.set_cpus(cpus);
    request.set_threads(threads);
  }
  grpc::Status status = stub_->WorkerHeartbeat(&context, request, response);
  if (draining_) release_pending_ = status.ok() && response->release_pending();
  return status;
}

bool WorkerRegistration::ReportDraining() {
  draining_ = true;
  v1::WorkerHeartbeatResponse response;
  return Heartbeat(&response).ok() && response.release_pending();
}

void WorkerRegistration::Loop() {
  bool registered = false;
  bool reported_outage = false;
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stop_.HasBeenNotified()) {
    bool ok = false;
    if (!registered) {
      ok = registered = Register();
    } else {
      v1::WorkerHeartbeatResponse response;
      grpc::Status status = Heartbeat(&response);
      ok = status.ok();
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) registered = false;
      // The coordinator stretches the interval as the cluster grows.
      if (ok && response.heartbeat_interval_ms() > 0) {
        interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
      }
      if (ok && !response.abandoned_job().empty() && hooks_.abandon_job) {
        hooks_.abandon_job(response.abandoned_job());
      }
      if (ok && hooks_.same_host) hooks_.same_host(response.same_host());
    }
    if (ok) {
      if (reported_outage) {
        LogInfo("the coordinator is reachable again", {{"coordinator", coordinator_}});
      }
      reported_outage = false;
      backoff = absl::Milliseconds(100);
      stop_.WaitForNotificationWithTimeout(interval_);
      continue;
    }
    if (!reported_outage && !registered) {
      LogWarning("cannot register with the coordinator; retrying with backoff",
                 {{"coordinator", coordinator_}});
      reported_outage = true;
    }
    stop_.WaitForNotificationWithTimeout(registered ? interval_ : backoff);
    backoff = std::min(kMaxBackoff, backoff * 2);
  }
}

}  // namespace dtrain

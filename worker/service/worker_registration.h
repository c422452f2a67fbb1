// A worker daemon's presence at the coordinator: registers (name, address, devices), sends
// heartbeats carrying its current job, registers again when the coordinator has forgotten it
// (restarted, or the worker was silent too long), and unregisters on shutdown. A coordinator
// that cannot be reached is retried with backoff and reported once per outage, never fatal:
// the daemon keeps serving.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dtrain/v1/workers.grpc.pb.h"

namespace dtrain {

class WorkerRegistration {
 public:
  // What the daemon answers and hears at each registration and heartbeat, on the heartbeat
  // thread (none may block).
  struct Hooks {
    std::function<std::string()> current_job;
    // The coordinator says that job is no longer this worker's.
    std::function<void(const std::string&)> abandon_job;
    // Where its steps run now: cores ("" when not pinned) and compute threads.
    std::function<std::pair<std::string, int>()> placement;
    // The other workers of this host, as of this answer.
    std::function<void(const google::protobuf::RepeatedPtrField<v1::WorkerInfo>&)> same_host;
  };
  WorkerRegistration(const std::string& coordinator, v1::WorkerInfo self, Hooks hooks);
  // Stops heartbeats and unregisters (bounded by a short deadline).
  ~WorkerRegistration();

  uint64_t incarnation() const { return self_.incarnation(); }

  // Tells the coordinator, now and in every later heartbeat, that this worker is stopping, so
  // it is placed on no job. Returns whether the coordinator runs this worker's current job and
  // will checkpoint it and release the worker (false also when it could not be reached).
  bool ReportDraining();
  // While draining: the coordinator's latest answer to that question (see ReportDraining).
  bool release_pending() const { return release_pending_; }

 private:
  void Loop();
  bool Register();

  v1::WorkerInfo self_;
  std::string coordinator_;
  Hooks hooks_;
  std::unique_ptr<v1::Workers::Stub> stub_;
  absl::Duration interval_ = absl::Seconds(1);
  // Sends one heartbeat; NOT_FOUND means register again.
  grpc::Status Heartbeat(v1::WorkerHeartbeatResponse* response);

  std::atomic<bool> draining_{false};
  std::atomic<bool> release_pending_{false};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace dtrain

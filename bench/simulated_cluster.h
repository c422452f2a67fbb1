// A cluster of worker machines simulated in one process, for bench/coordinator_scale: the
// worker daemons' registration and heartbeats (Daemons), and one Worker service answering for
// all of them (SimulatedWorkers), whose steps take a fixed compute time per batch (Timer).
// A bench's stand-in for 1,000 machines; no test uses it.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dtrain/v1/worker.grpc.pb.h"
#include "dtrain/v1/workers.grpc.pb.h"

namespace dtrain {

// Runs callbacks at given times on one thread: the simulated compute of every step.
class Timer {
 public:
  Timer();
  ~Timer();
  void At(absl::Time when, std::function<void()> f);

 private:
  struct Item {
    absl::Time when;
    int64_t seq;
    std::function<void()> f;
    bool operator>(const Item& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  void Loop();
  absl::Mutex mu_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Worker i listens (as far as the coordinator knows) at 127.1.(i / 250).(i % 250 + 1):port.
std::string WorkerHost(int i);

// The Worker service of every simulated worker: it tells them apart by the address the
// coordinator dialled, joins each job's ranks in process and answers a step after
// `batch_time` per batch, as a model computing would. The dataset it reports is Fashion-MNIST's
// size, so epochs end, validate and checkpoint as they would.
class SimulatedWorkers final : public v1::Worker::CallbackService {
 public:
  SimulatedWorkers(int workers, absl::Duration batch_time, Timer* timer);
  // The job worker i runs ("" when idle): its heartbeat reports it.
  std::string JobOf(int i);

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
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* context,
                                           const v1::SaveCheckpointRequest* request,
                                           v1::SaveCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ReduceBooleanDecision(grpc::CallbackServerContext* context,
                                                  const v1::DecisionRequest* request,
                                                  v1::DecisionResponse* response) override;
  grpc::ServerUnaryReactor* Teardown(grpc::CallbackServerContext* context,
                                     const v1::TeardownRequest* request,
                                     v1::TeardownResponse* response) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;

 private:
  struct Pending {
    int worker;
    grpc::ServerUnaryReactor* reactor;
    v1::SetupResponse* response;
  };
  struct Hosted {
    std::string job;
    int rank = 0;
    int64_t global_step = 0;
  };

  int Index(grpc::CallbackServerContext* context) const;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const v1::StepRequest* request, v1::StepResponse* response,
                                 bool training);

  const absl::Duration batch_time_;
  Timer* timer_;
  std::map<std::string, int> index_;  // "127.1.x.y" -> worker
  absl::Mutex mu_;
  std::vector<Hosted> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Pending>> groups_ ABSL_GUARDED_BY(mu_);
};

// The simulated worker daemons: each registers over a connection of its own, as separate
// machines have, then heartbeats at the interval the coordinator hands out (the daemon's loop,
// worker/service/worker_registration.cc), reporting the job `service` says it runs.
class Daemons {
 public:
  Daemons(const std::string& coordinator, int n, int port, SimulatedWorkers* service);

  // Registers every daemon, one after another, as machines boot.
  absl::Status RegisterAll();
  // Heartbeats every daemon at the interval, spread evenly over it, until Stop.
  void Start();
  void Stop();
  // Latencies (ms) of heartbeats sent in [from, to).
  void Window(absl::Time from, absl::Time to);
  std::vector<double> WindowLatencies();
  int64_t failures();
  int64_t sent();
  absl::Duration interval() const { return interval_; }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::WorkerHeartbeatRequest request;
    v1::WorkerHeartbeatResponse response;
    absl::Time sent;
  };
  void Loop();

  SimulatedWorkers* service_;
  std::vector<std::unique_ptr<v1::Workers::Stub>> stubs_;
  int port_ = 0;
  absl::Duration interval_ = absl::Seconds(1);
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time window_from_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time window_to_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<double> window_latencies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain

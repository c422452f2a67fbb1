// WorkerServer: one running worker daemon, as CoordinatorServer is one coordinator. It owns the
// Worker service (one job at a time) on a gRPC server with health and reflection, the metrics
// registry and its /metrics endpoint, the cache of the coordinator's files with its client, and
// the registration with the coordinator (heartbeats). Drain is SIGTERM's graceful stop: no new
// job, the running step finishes or the coordinator checkpoints the job and lets this worker go.
// Used by dtrain-worker's main (worker/main.cc); a ddp_spawn child is one too, without the
// registration and the cache.
//
// Thread-safety: Start, Drain and Stop from one thread (main's); the accessors from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/runtime/worker_identity.h"

namespace grpc {
class Server;
class ServerCredentials;
}  // namespace grpc

namespace dtrain {

class ArtifactCache;
class ArtifactsClient;
class MetricsHttpServer;
class MetricsRegistry;
class WorkerRegistration;
class WorkerService;

struct WorkerServerOptions {
  // host:port to serve the Worker service on; port 0 picks a free one (read it back with port()).
  std::string listen_address = "127.0.0.1:29611";
  // TLS for the listening port (common/tls_credentials.h); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Who this worker is. Empty name: <host>:<port>, or <host>-<pid> for port 0; empty host: this
  // machine's name; devices 0: auto (the CUDA devices, else 1).
  WorkerIdentity identity;
  // The bearer token every call must present, and the worker presents to its coordinator; empty:
  // none.
  std::string token;
  // A rank child (ddp_spawn, rank isolation): reached by its parent alone, so no registration
  // and no file cache.
  bool child = false;
  // Every job's ranks run in a child process that never holds `token` (SpawnedJob kWholeJob);
  // needs spawn_binary.
  bool isolate_ranks = false;
  // This program, run with --child by ddp_spawn; empty disables ddp_spawn.
  std::string spawn_binary;
  // host:port the coordinator should use to reach this worker; empty: the listen address, with
  // this machine's name for a wildcard host.
  std::string advertise_address;
  // If set, the bound port is written here once serving (before the registration starts).
  std::string port_file;
  // host:port of the Prometheus /metrics endpoint (plain HTTP); empty: none.
  std::string metrics_listen;
  // If set (with metrics_listen), the /metrics port is written here once serving, before
  // port_file: a reader of the gRPC port file then finds both.
  std::string metrics_port_file;
  // The files jobs name by content, kept between jobs (default
  // <DefaultCacheDirectory()>/worker/<name>), and the cache's size bound (0: none).
  std::string cache_dir;
  int64_t cache_bytes = int64_t{20} << 30;
  // Where a job's checkpoints are written before they go to the coordinator (default
  // <DefaultStateDirectory()>/worker-jobs/<name>).
  std::string jobs_dir;
  // Drain: how long the running step may finish, or the coordinator may checkpoint the job.
  absl::Duration drain_timeout = absl::Seconds(60);
  // The cores this process may use (its cpuset and affinity).
  std::vector<int> allowed_cpus;
  // --cpus=auto: the steps' place follows the other workers of this host (cpu_placement.h),
  // with at most `threads_flag` compute threads (--threads; 0: one per core of the share).
  bool place_cpus = false;
  int threads_flag = 0;
  double quota_cores = 0;  // the cgroup's CPU quota in cores (CpuQuotaCores); 0: none
};

class WorkerServer {
 public:
  // Serves, writes the port file and starts registering. UNAVAILABLE when the listen address
  // cannot be bound; FAILED_PRECONDITION when the metrics address cannot be (both messages name
  // the address).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(WorkerServerOptions options);
  // Stop().
  ~WorkerServer();

  int port() const { return port_; }
  // The identity the worker serves with, defaults filled in.
  const WorkerIdentity& identity() const { return options_.identity; }
  // The /metrics port, 0 without metrics_listen.
  int metrics_port() const;
  WorkerService& service() { return *service_; }

  // SIGTERM's graceful part, then the hard stop of the job: health answers NOT_SERVING and no new
  // job is taken; the running step finishes, or a job the coordinator runs is checkpointed and
  // lets this worker go (it resumes elsewhere); bounded by drain_timeout. `interrupted(wait)`
  // waits up to `wait` and returns true to cut the drain short (a second signal). Then the step
  // is stopped and the job leaves its group. `signal` names the cause in the log.
  void Drain(const std::string& signal,
             const std::function<bool(absl::Duration wait)>& interrupted);
  // Stops the job (as Drain's end, if Drain did not run), unregisters, stops the gRPC server
  // (within 5 s) and the /metrics endpoint. Idempotent (later calls return the first's
  // outcome). Not OK when the running call did not stop (WorkerService::StopNow): nothing is
  // torn down (the registration keeps heartbeating), and the process should _Exit.
  absl::Status Stop();

 private:
  explicit WorkerServer(WorkerServerOptions options);
  void DescribeMetrics();
  void Register();

  WorkerServerOptions options_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<ArtifactsClient> artifacts_client_;
  std::unique_ptr<ArtifactCache> artifacts_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WorkerRegistration> registration_;
  int port_ = 0;
  bool stopped_ = false;
  absl::Status stop_status_;  // Stop's outcome, for the calls after the first
};

}  // namespace dtrain

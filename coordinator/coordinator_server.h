// CoordinatorServer: owns one running coordinator (group table, collective engine, key-value
// store, worker registry, job manager, artifact store, gRPC server with the Coordinator, Workers,
// Jobs and Artifacts services on one port) and the single background thread that drives
// deadlines and liveness.
// Used by dtrain-coordinator's main and by tests that run a coordinator in-process.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics_http_server.h"
#include "common/metrics_registry.h"
#include "coordinator/artifacts/artifact_store.h"
#include "coordinator/artifacts/artifacts_service.h"
#include "coordinator/auth/access_control.h"
#include "coordinator/collectives/collective_engine.h"
#include "coordinator/collectives/coordinator_service.h"
#include "coordinator/collectives/group_table.h"
#include "coordinator/collectives/kv_store.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/jobs_service.h"
#include "coordinator/jobs/worker_registry.h"
#include "coordinator/jobs/workers_service.h"
#include "coordinator/retired_methods.h"
#include "coordinator/web/web_server.h"

namespace grpc {
class Server;
}

namespace dtrain {

inline constexpr int kDefaultCoordinatorPort = 29610;

struct CoordinatorOptions {
  // host:port; port 0 picks a free one (read it back with port()).
  std::string listen_address = "127.0.0.1:29610";
  GroupTableOptions groups;
  // How often deadlines are checked while calls wait on them (collectives, key-value gets, a
  // forming group's registrations) or jobs wait to be placed: the precision of their timeouts.
  // With nothing but heartbeats due, the monitor ticks every 100 ms (or this, if longer).
  absl::Duration tick = absl::Milliseconds(20);
  // Jobs' logs, metrics and checkpoints go under <state_dir>/jobs/<id>/; empty:
  // <DefaultStateDirectory()>/coordinator (common/directories.h).
  std::string state_dir;
  // The SQLite job database (job_store.h), usually <state_dir>/coordinator.db; empty: jobs are
  // kept in memory only (in-process tests).
  std::string database;
  // The host:port workers use to reach this coordinator (port 0: the port it listens on);
  // empty: the listen address (with this machine's name for a wildcard host).
  std::string advertise_address;
  // The workers' heartbeats as a whole, per second (0: no cap): past heartbeat_interval x this
  // many workers, the interval handed out (and the lost-worker timeout) grows in proportion.
  double max_worker_heartbeats_per_second = 500;
  // Deadlines of a job's worker RPCs.
  absl::Duration job_setup_timeout = absl::Minutes(5);
  absl::Duration job_step_timeout = absl::Minutes(30);
  // TLS for the listening port (common/tls_credentials.h); null = plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // The cluster's admin token (coordinator/auth/access_control.h); empty: access control off.
  // The coordinator also presents it to its workers, so it must be the process's client token
  // too.
  std::string admin_token;
  // host:port of the Prometheus /metrics endpoint (plain HTTP); empty: none.
  std::string metrics_listen;
  // Uploaded files (<state_dir>/artifacts): the largest one accepted and the total kept;
  // 0: no limit.
  int64_t max_artifact_bytes = int64_t{64} << 30;
  int64_t artifact_quota_bytes = 0;
  // host:port of the dashboard and HTTP JSON API (coordinator/web); empty: none. Served over
  // HTTPS with `http_tls` when it names a certificate and key.
  std::string http_listen;
  TlsFiles http_tls;
  // Serve it beyond loopback without a token (as --insecure does for gRPC).
  bool http_insecure = false;
  // Host names the dashboard answers for; empty: its defaults (web_server.h).
  std::vector<std::string> http_allowed_hosts;
};

class CoordinatorServer {
 public:
  // UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(CoordinatorOptions options);

  ~CoordinatorServer();

  int port() const { return port_; }
  // "127.0.0.1:<port>"
  std::string address() const;

  // Fails every pending call with UNAVAILABLE, then stops the server. Idempotent.
  void Shutdown();

  const CollectiveEngine& engine() const { return *engine_; }
  const KeyValueStore& kv() const { return *kv_; }
  JobManager& jobs() { return *jobs_; }
  AccessControl& access() { return *access_; }
  const MetricsRegistry& metrics() const { return *metrics_; }
  // The dashboard's URL, "" without http_listen.
  std::string web_url() const { return web_ != nullptr ? web_->url() : ""; }
  int web_port() const { return web_ != nullptr ? web_->port() : 0; }
  // The /metrics port, 0 without --metrics_listen.
  int metrics_port() const { return metrics_http_ != nullptr ? metrics_http_->port() : 0; }

 private:
  explicit CoordinatorServer(CoordinatorOptions options);
  void MonitorLoop();

  const CoordinatorOptions options_;
  void DescribeMetrics();

  std::unique_ptr<AccessControl> access_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::unique_ptr<KeyValueStore> kv_;
  std::unique_ptr<GroupTable> groups_;
  std::unique_ptr<CollectiveEngine> engine_;
  std::unique_ptr<WorkerRegistry> workers_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<WorkersService> workers_service_;
  std::unique_ptr<RetiredMethods> retired_methods_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<JobsService> jobs_service_;
  std::unique_ptr<ArtifactStore> artifacts_;
  std::unique_ptr<ArtifactsService> artifacts_service_;
  std::unique_ptr<WebServer> web_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string host_;
  absl::Notification stop_monitor_;
  std::thread monitor_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace dtrain

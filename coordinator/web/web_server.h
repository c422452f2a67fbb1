// The coordinator's web side: an HTTP JSON API under /api/v1/ (jobs, one job, its metric points
// and log, workers, groups, a cluster summary, cancel, server-sent events of job updates) and
// the dashboard that uses only that API. Every body is a protobuf message of the gRPC API in
// proto3's JSON mapping, so the same fields mean the same things on both sides. cpp-httplib
// (Debian's libcpp-httplib-dev) serves it, with TLS from the coordinator's certificate when the
// gRPC side uses TLS.
//
// Security follows the gRPC side (web_access.h): with an admin token, every page and call needs
// it, as a bearer header or through a session cookie the login page sets; POSTs refuse other
// origins; without a token it serves only on loopback unless told otherwise. Requests naming a
// host not allowed are refused (DNS rebinding). Connections, heads, bodies and their timing are
// bounded before any of this runs (common/bounded_http_server.h), and live event streams are
// capped in total and per client.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls_credentials.h"
#include "coordinator/artifacts/artifact_store.h"
#include "coordinator/collectives/group_table.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/worker_registry.h"

namespace httplib {
class Server;
}

namespace dtrain {

class WebAccess;

struct WebServerOptions {
  std::string listen;       // host:port; port 0 picks one
  std::string admin_token;  // "": no authentication (then loopback only, unless insecure)
  bool insecure = false;    // serve beyond loopback without a token or TLS
  TlsFiles tls;             // cert and key set: HTTPS
  // Host names requests may name (--http_allowed_hosts); empty: the listen host, localhost,
  // 127.0.0.1, ::1, this machine's name and `advertised_host`.
  std::vector<std::string> allowed_hosts;
  std::string advertised_host;  // the host of the coordinator's --advertise, if any
};

// What the web side reads and acts on; all must outlive the server.
struct WebSources {
  JobManager* jobs = nullptr;
  WorkerRegistry* workers = nullptr;
  const GroupTable* groups = nullptr;
  ArtifactStore* artifacts = nullptr;
};

class WebServer {
 public:
  // INVALID_ARGUMENT for a bad address or an unsafe setting (beyond loopback with neither token
  // nor --insecure, or with a token but without TLS); UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(WebServerOptions options,
                                                          WebSources sources);
  ~WebServer();

  int port() const { return port_; }
  // http(s)://host:port/
  std::string url() const { return url_; }

 private:
  WebServer() = default;
  void AddRoutes();

  WebServerOptions options_;
  WebSources sources_;
  std::unique_ptr<WebAccess> access_;
  // Set when stopping: live streams end, so the server's threads can be joined.
  std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::string url_;
};

}  // namespace dtrain

// The /metrics endpoint of a dtrain daemon: plain HTTP on its own port (Prometheus scrapes
// HTTP, not gRPC), serving MetricsRegistry::Render. cpp-httplib (Debian's libcpp-httplib-dev)
// does the HTTP.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics_registry.h"

namespace httplib {
class Server;
}

namespace dtrain {

class MetricsHttpServer {
 public:
  // Serves `registry` (which must outlive the server) at http://<listen>/metrics; port 0 picks
  // one. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                                  const MetricsRegistry* registry);
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace dtrain

#include "common/metrics_http_server.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_http_server.h"
#include "common/http_port_alone.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, const MetricsRegistry* registry) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen '", listen, "' is not host:port"));
  }
  const std::string host = listen.substr(0, colon);
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  // Scrapers send one small GET: a few threads, and heads far below the dashboard's limit.
  HttpLimits limits;
  limits.threads = 4;
  limits.max_connections = 32;
  limits.max_connections_per_client = 2;
  limits.max_head_bytes = 16 << 10;
  limits.max_body_bytes = 0;
  absl::StatusOr<std::unique_ptr<httplib::Server>> bounded = NewBoundedHttpServer(limits);
  if (!bounded.ok()) return bounded.status();
  server->server_ = *std::move(bounded);
  BindPortAlone(*server->server_);
  server->server_->Get(
      "/metrics", [registry](const httplib::Request&, httplib::Response& response) {
        response.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
      });
  server->port_ = port == 0 ? server->server_->bind_to_any_port(host.c_str())
                            : (server->server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " for /metrics"));
  }
  httplib::Server* raw = server->server_.get();
  server->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dtrain

// libFuzzer target: bytes as what a client sends to one of dtrain's HTTP servers before it is
// authenticated (common/bounded_http_server.h, the dashboard's and /metrics' server): the
// request line, headers and body through the bounded connection loop and cpp-httplib's parser,
// over a real loopback connection, into handlers that do what the dashboard does first: check
// the Host, the Origin, the bearer token or session cookie (coordinator/web/web_access.h), and
// log in with a posted token. A crash or a sanitizer report is a finding, as is a server that
// stops answering a well-formed request afterwards. Seeds in tests/fuzz/corpus/http_request/.
// Built and run by tests/fuzz/run.sh, and for a few seconds in every CI run
// (http_request_fuzz_check).
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <httplib.h>

#include "common/bounded_http_server.h"
#include "coordinator/web/web_access.h"

namespace {

struct Fixture {
  std::unique_ptr<httplib::Server> server;
  std::unique_ptr<dtrain::WebAccess> access;
  std::thread thread;
  int port = 0;
};

Fixture* Start() {
  ::signal(SIGPIPE, SIG_IGN);
  auto* f = new Fixture();
  dtrain::HttpLimits limits;
  limits.max_head_bytes = 4096;
  limits.max_body_bytes = 8192;
  limits.head_timeout = absl::Milliseconds(500);
  limits.body_timeout = absl::Milliseconds(500);
  limits.keep_alive_timeout = absl::Milliseconds(200);
  limits.threads = 4;
  absl::StatusOr<std::unique_ptr<httplib::Server>> server = dtrain::NewBoundedHttpServer(limits);
  if (!server.ok()) std::abort();
  f->server = std::move(*server);
  f->access = std::make_unique<dtrain::WebAccess>("fuzz-admin-token", /*https=*/false);
  f->access->AllowHosts({"localhost", "127.0.0.1"});
  dtrain::WebAccess* access = f->access.get();
  auto guarded = [access](const httplib::Request& req, httplib::Response& res) {
    if (!access->CheckHost(req.get_header_value("Host")).ok()) {
      res.status = 403;
      return;
    }
    if (!access->CheckSameOrigin(req.get_header_value("Origin"), req.get_header_value("Host"))
             .ok()) {
      res.status = 403;
      return;
    }
    absl::Status s =
        access->Check(req.get_header_value("Authorization"), req.get_header_value("Cookie"));
    res.status = s.ok() ? 200 : 401;
    res.set_content(std::string(s.message()) + req.body, "text/plain");
  };
  // cpp-httplib takes the first route that matches: the login before the catch-all.
  f->server->Post("/login", [access](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<std::string> cookie = access->LoginWithBody(req.body, req.remote_addr);
    res.status = cookie.ok() ? 200 : 401;
    if (cookie.ok()) res.set_header("Set-Cookie", *cookie);
  });
  f->server->Get(".*", guarded);
  f->server->Post(".*", guarded);
  f->port = f->server->bind_to_any_port("127.0.0.1");
  if (f->port <= 0) std::abort();
  f->thread = std::thread([f] { f->server->listen_after_bind(); });
  while (!f->server->is_running()) std::this_thread::yield();
  return f;
}

// Sends `bytes` on a new connection, closes its sending side and reads until the server closes
// (or 2 s pass); what it answered.
std::string Exchange(int port, const char* bytes, size_t size) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::abort();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(fd, bytes + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    char buffer[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 2000) > 0) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      answer.append(buffer, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return answer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = Start();
  static int64_t runs = 0;
  Exchange(fixture->port, reinterpret_cast<const char*>(data), size);
  // Now and then, a well-formed request must still be served.
  if (++runs % 256 == 0) {
    static const char kProbe[] =
        "GET /api/v1/jobs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer fuzz-admin-token"
        "\r\nConnection: close\r\n\r\n";
    if (Exchange(fixture->port, kProbe, sizeof(kProbe) - 1).rfind("HTTP/1.1 200", 0) != 0) {
      std::abort();
    }
  }
  return 0;
}

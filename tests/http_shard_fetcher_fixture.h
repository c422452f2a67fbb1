// The servers the tests of the HTTP shard fetcher fetch from, and their helpers: Debian's nginx
// (http_shard_fetcher_test.cc), a small TCP server that misbehaves
// (http_shard_fetcher_broken_server_test.cc, and one test of the first file), options whose
// timeouts and backoffs are milliseconds, random shards and their digests, and the spool files
// a fetch leaves behind.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"
#include "worker/data/http_shard_fetcher.h"

// A named (inline) namespace, not an anonymous one: both files are compiled into one test
// executable, where a header's classes must be one type. In dtrain, where the two files' tests
// are, not in dtrain::testing, whose own FastOptions (a coordinator's) would be ambiguous.
namespace dtrain {
inline namespace http_shard_fetcher_fixture {

inline constexpr char kNginx[] = "/usr/sbin/nginx";

// Options that keep each failure test short. The stall timeout is long: a server
// (or this process) held up for a moment on a loaded CI machine must not make a spurious retry
// that the exact request counts would see; the stall tests set their own.
inline HttpFetchOptions FastOptions() {
  HttpFetchOptions o;
  o.connect_timeout = absl::Seconds(2);
  o.stall_timeout = absl::Seconds(10);
  o.max_attempts = 3;
  o.initial_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(40);
  return o;
}

inline std::string RandomBytes(int64_t size, uint32_t seed) {
  std::mt19937 generator(seed);
  std::string bytes(static_cast<size_t>(size), '\0');
  for (char& c : bytes) c = static_cast<char>(generator() & 0xff);
  return bytes;
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

inline std::string DigestOf(const std::string& bytes) {
  Sha256 hasher;
  hasher.Update(bytes);
  return hasher.Finish();
}

// Files of `directory` whose name contains `part` (left-over spool files).
inline int FilesContaining(const std::string& directory, const std::string& part) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (absl::StrContains(entry.path().filename().string(), part)) ++n;
  }
  return n;
}

// Debian's nginx in the foreground, one process (master_process off: nothing to orphan, and no
// switch to another user, so it reads the test's files), everything under its own directory.
class NginxServer {
 public:
  // Serves <dir>/www; extra_locations go inside the server block. With a tls_dir (made by
  // deploy/tls/make-test-certs.sh) it serves https with tls_dir/server.pem.
  static std::unique_ptr<NginxServer> Start(const std::string& dir,
                                            const std::string& extra_locations,
                                            const std::string& tls_dir, std::string* error) {
    if (access(kNginx, X_OK) != 0) {
      *error = absl::StrCat(kNginx,
                            " is missing: this test needs Debian's nginx "
                            "(deploy/install-deps.sh --test installs it)");
      return nullptr;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto server = std::unique_ptr<NginxServer>(new NginxServer(dir));
      server->port_ = dtrain::testing::PickFreePort();
      server->scheme_ = tls_dir.empty() ? "http" : "https";
      const std::string tls =
          tls_dir.empty()
              ? ";\n"
              : absl::StrCat(" ssl;\n    ssl_certificate ", tls_dir,
                             "/server.pem;\n    ssl_certificate_key ", tls_dir, "/server.key;\n");
      const std::string config = absl::StrCat(
          "daemon off;\nmaster_process off;\npid ", dir, "/nginx.pid;\nerror_log ", dir,
          "/error.log info;\nevents { worker_connections 64; }\nhttp {\n  access_log ", dir,
          "/access.log;\n  client_body_temp_path ", dir, "/client_body;\n  proxy_temp_path ", dir,
          "/proxy;\n  fastcgi_temp_path ", dir, "/fastcgi;\n  uwsgi_temp_path ", dir,
          "/uwsgi;\n  scgi_temp_path ", dir,
          "/scgi;\n  server {\n    listen 127.0.0.1:", server->port_, tls, "    root ", dir,
          "/www;\n", extra_locations, "  }\n}\n");
      unlink((dir + "/nginx.pid").c_str());
      WriteFile(dir + "/nginx.conf", config);
      server->process_ = dtrain::testing::Subprocess::Start(
          {kNginx, "-p", dir, "-c", dir + "/nginx.conf", "-e", dir + "/error.log"});
      if (server->process_ == nullptr) {
        *error = absl::StrCat("cannot start ", kNginx);
        return nullptr;
      }
      // nginx writes its pid file once its socket listens; it exits when the bind fails.
      const std::string pid = absl::StrCat(server->process_->pid());
      const std::string pid_file = dir + "/nginx.pid";
      bool exited = false;
      const bool ready = dtrain::testing::WaitFor(
          [&] {
            if (server->process_->Wait(absl::Milliseconds(1)) != -1) exited = true;
            return exited || absl::StripAsciiWhitespace(dtrain::testing::ReadFile(pid_file)) == pid;
          },
          absl::Seconds(10));
      if (ready && !exited) return server;
      *error = absl::StrCat("nginx did not start on port ", server->port_, "; its error log:\n",
                            dtrain::testing::ReadFile(dir + "/error.log"));
      if (!exited) return nullptr;  // hung: no point retrying another port
    }
    return nullptr;
  }

  ~NginxServer() {
    if (process_ != nullptr) {
      process_->Kill(SIGTERM);
      if (process_->Wait(absl::Seconds(5)) == -1) process_->Kill(SIGKILL);
    }  // ~Subprocess reaps it in any case
  }

  std::string Url(const std::string& path) const {
    return absl::StrCat(scheme_, "://127.0.0.1:", port_, path);
  }
  // How many requests for `path` nginx logged (it logs after answering, so wait a little).
  int Requests(const std::string& path, int at_least) const {
    const auto count = [&] {
      int n = 0;
      for (absl::string_view line :
           absl::StrSplit(dtrain::testing::ReadFile(dir_ + "/access.log"), '\n')) {
        if (absl::StrContains(line, absl::StrCat("\"GET ", path, " "))) ++n;
      }
      return n;
    };
    dtrain::testing::WaitFor([&] { return count() >= at_least; }, absl::Seconds(2));
    return count();
  }

 private:
  explicit NginxServer(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::string scheme_;
  int port_ = 0;
  std::unique_ptr<dtrain::testing::Subprocess> process_;
};

// A TCP server on 127.0.0.1:0 that speaks just enough HTTP/1.1 to misbehave in one way.
class FakeHttpServer {
 public:
  enum class Mode {
    kNeverAnswer,         // reads the request, then holds the connection open, silent
    kTruncate,            // Content-Length: 2x the body, sends the body, closes
    kFailTwiceThenServe,  // 503 to the first two connections, then 200 with the body
    kStallMidBody,        // Content-Length: 2x the body, sends the body, then holds on, silent
  };

  FakeHttpServer(Mode mode, std::string body) : mode_(mode), body_(std::move(body)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        listen(listen_fd_, 16) == 0 &&
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }

  int port() const { return port_; }
  std::string Url(const std::string& path_and_query) const {
    return absl::StrCat("http://127.0.0.1:", port_, path_and_query);
  }
  int connections() const {
    absl::MutexLock lock(&mu_);
    return connections_;
  }
  // Whether `n` connections arrived (and sent their request) within `timeout`.
  bool WaitForConnections(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    const auto arrived = [this, n]()
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connections_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  }

 private:
  void Serve() {
    std::vector<int> held;
    while (!stop_) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      if (poll(&pfd, 1, 20) <= 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ReadRequest(fd);
      int number;
      {
        absl::MutexLock lock(&mu_);
        number = ++connections_;
      }
      switch (mode_) {
        case Mode::kNeverAnswer:
          held.push_back(fd);
          continue;
        case Mode::kStallMidBody:
          Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", 2 * body_.size(), "\r\n\r\n",
                                body_));
          held.push_back(fd);
          continue;
        case Mode::kTruncate:
          Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", 2 * body_.size(),
                                "\r\nConnection: close\r\n\r\n", body_));
          break;
        case Mode::kFailTwiceThenServe:
          if (number <= 2) {
            Send(fd,
                 "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                 "Connection: close\r\n\r\n");
          } else {
            Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", body_.size(),
                                  "\r\nConnection: close\r\n\r\n", body_));
          }
          break;
      }
      close(fd);
    }
    for (int fd : held) close(fd);
  }

  // Up to the blank line that ends the request's headers (a GET has no body), or 2 s.
  static void ReadRequest(int fd) {
    std::string request;
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (!absl::StrContains(request, "\r\n\r\n") && absl::Now() < deadline) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 50) <= 0) continue;
      char buffer[4096];
      const ssize_t n = read(fd, buffer, sizeof buffer);
      if (n <= 0) return;
      request.append(buffer, static_cast<size_t>(n));
    }
  }

  static void Send(int fd, const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  const Mode mode_;
  const std::string body_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace http_shard_fetcher_fixture
}  // namespace dtrain

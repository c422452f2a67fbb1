#include "common/bounded_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <functional>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include <httplib.h>
#include <openssl/ssl.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dtrain {
namespace {

// What the current request on this thread ran into (HttpLimitHit).
struct LimitHit {
  int status = 0;
  std::string message;
};
thread_local LimitHit tl_hit;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Service Unavailable";
  }
}

// The {"error": {...}} body dtrain's HTTP API answers with, for a limit's message.
std::string ErrorJson(int status, absl::string_view message) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped.push_back('\\');
    escaped.push_back(c);
  }
  const char* code = status == 408   ? "DEADLINE_EXCEEDED"
                     : status == 503 ? "UNAVAILABLE"
                                     : "RESOURCE_EXHAUSTED";
  return absl::StrCat("{\"error\":{\"code\":\"", code, "\",\"message\":\"", escaped, "\"}}");
}

int MillisUntil(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

// Whether `fd` becomes ready for `events` before `deadline` (an error or hang-up counts as
// ready: the next read or write reports it).
bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, MillisUntil(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

void Address(const sockaddr_storage& a, std::string* ip, int* port) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    *port = ntohs(v6->sin6_port);
  }
  *ip = text;
}

// httplib's Stream over a non-blocking socket, plain or TLS, with a buffer (httplib reads a
// request's head one byte per call), a budget of bytes that may be read for the current part
// of the request, and an absolute deadline for it.
class BoundedStream : public httplib::Stream {
 public:
  BoundedStream(int fd, SSL* ssl, absl::Duration write_timeout)
      : fd_(fd), ssl_(ssl), write_timeout_(write_timeout) {
    sockaddr_storage a{};
    socklen_t n = sizeof(a);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0) {
      Address(a, &remote_ip_, &remote_port_);
    }
    n = sizeof(a);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0) {
      Address(a, &local_ip_, &local_port_);
    }
  }

  // From now on at most `bytes` more may be read, by `deadline`; past either the read fails
  // and HttpLimitHit says which, with `status`.
  void Limit(size_t bytes, absl::Time deadline, int status, std::string what) {
    budget_ = bytes;
    deadline_ = deadline;
    over_status_ = status;
    over_what_ = std::move(what);
  }
  void StartRequest() { written_ = 0; }
  size_t written() const { return written_; }
  bool hit() const { return hit_; }
  bool has_buffered() const { return begin_ < end_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }

  bool is_readable() const override { return has_buffered() || WaitFor(fd_, POLLIN, deadline_); }
  // False once the client has gone (hung up or shut its side), so that a live stream that
  // writes rarely notices within its next check rather than at its next write.
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return false;
    return WaitFor(fd_, POLLOUT, absl::Now() + write_timeout_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (hit_) return -1;
    if (budget_ == 0) {
      Hit(over_status_, absl::StrCat(over_what_, " is larger than this server accepts"));
      return -1;
    }
    if (begin_ == end_) {
      const ssize_t n = Fill();
      if (n <= 0) return n;
    }
    const size_t n = std::min({size, end_ - begin_, budget_});
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    budget_ -= n;
    return static_cast<ssize_t>(n);
  }

  // Writes all of it (some of httplib's writes ignore a short count) or fails; the deadline is
  // per call, so a client that stops reading is let go.
  ssize_t write(const char* ptr, size_t size) override {
    const absl::Time deadline = absl::Now() + write_timeout_;
    size_t done = 0;
    while (done < size) {
      ssize_t n = 0;
      int wait_for = POLLOUT;
      const size_t left = size - done;
      if (ssl_ != nullptr) {
        n = SSL_write(ssl_, ptr + done, static_cast<int>(std::min<size_t>(left, INT_MAX)));
        if (n > 0) {
          done += static_cast<size_t>(n);
          continue;
        }
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if (error == SSL_ERROR_WANT_READ) {
          wait_for = POLLIN;
        } else if (error != SSL_ERROR_WANT_WRITE) {
          return -1;
        }
      } else {
        n = ::send(fd_, ptr + done, left, MSG_NOSIGNAL);
        if (n >= 0) {
          done += static_cast<size_t>(n);
          continue;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      }
      if (!WaitFor(fd_, static_cast<short>(wait_for), deadline)) return -1;
    }
    written_ += size;
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = remote_ip_;
    port = remote_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_ip_;
    port = local_port_;
  }
  int socket() const override { return fd_; }

 private:
  void Hit(int status, std::string message) {
    hit_ = true;
    tl_hit.status = status;
    tl_hit.message = std::move(message);
  }

  // Reads what is there (up to the buffer) once the socket is readable; 0 at the peer's end.
  ssize_t Fill() {
    begin_ = end_ = 0;
    for (;;) {
      ssize_t n = 0;
      int wait_for = POLLIN;
      if (ssl_ != nullptr) {
        n = SSL_read(ssl_, buffer_, sizeof(buffer_));
        if (n > 0) {
          end_ = static_cast<size_t>(n);
          return n;
        }
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if (error == SSL_ERROR_ZERO_RETURN) return 0;
        if (error == SSL_ERROR_WANT_WRITE) {
          wait_for = POLLOUT;
        } else if (error != SSL_ERROR_WANT_READ) {
          return -1;
        }
      } else {
        n = ::recv(fd_, buffer_, sizeof(buffer_), 0);
        if (n >= 0) {
          end_ = static_cast<size_t>(n);
          return n;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      }
      if (!WaitFor(fd_, static_cast<short>(wait_for), deadline_)) {
        Hit(408, absl::StrCat(over_what_, " did not arrive in time"));
        return -1;
      }
    }
  }

  const int fd_;
  SSL* const ssl_;
  const absl::Duration write_timeout_;
  std::string remote_ip_, local_ip_;
  int remote_port_ = -1, local_port_ = -1;
  char buffer_[4096];
  size_t begin_ = 0, end_ = 0;
  size_t budget_ = 0;
  absl::Time deadline_ = absl::InfinitePast();
  int over_status_ = 431;
  std::string over_what_;
  size_t written_ = 0;
  bool hit_ = false;
};

// What both server kinds share: connection accounting and the request loop.
class ConnectionLoop {
 public:
  using ProcessRequest = std::function<bool(httplib::Stream&, bool, bool&,
                                            const std::function<void(httplib::Request&)>&)>;

  explicit ConnectionLoop(const HttpLimits& limits) : limits_(limits) {}

  const HttpLimits& limits() const { return limits_; }

  // Serves `sock` (already accepted) until the client is done, a limit is hit, or the server
  // stops; `ctx` set: TLS. Always closes the socket.
  // On the listening thread, for each accepted socket: admitted connections go to the pool,
  // the others are answered at once, so neither a queue nor open descriptors grow with what
  // clients open, and a client over its share never waits for a thread to be refused.
  void Admit(int sock, SSL_CTX* ctx, std::function<bool()> running, ProcessRequest process) {
    const int flags = ::fcntl(sock, F_GETFL, 0);
    ::fcntl(sock, F_SETFL, flags | O_NONBLOCK);
    // An answer goes out as head then body: without this, Nagle's algorithm holds the body
    // until the client's delayed ACK of the head, 40 ms per request on a keep-alive connection.
    int one = 1;
    (void)::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::string client;
    {
      sockaddr_storage a{};
      socklen_t n = sizeof(a);
      int port = 0;
      if (::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &n) == 0) {
        Address(a, &client, &port);
      }
    }
    const Admission admission = Enter(client);
    if (admission == Admission::kServerFull) {
      TurnAway(sock, ctx, 503,
               absl::StrCat("this server has ", limits_.max_connections,
                            " connections open, its limit; try again shortly"));
      return;
    }
    if (admission == Admission::kClientFull) {
      TurnAway(sock, ctx, 429,
               absl::StrCat(client, " has ", limits_.max_connections_per_client,
                            " connections open to this server, its limit per client"));
      return;
    }
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pool_ == nullptr) {  // not listening (stopped)
      ::close(sock);
      Leave(client);
      return;
    }
    pool_->enqueue(
        [this, sock, ctx, client, running = std::move(running), process = std::move(process)] {
          Serve(sock, ctx, running, process);
          Leave(client);
        });
  }

  // The pool of serving threads lives while the server listens (httplib's task queue).
  void StartPool() {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_ =
        std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, limits_.threads)));
  }
  void StopPool() {
    std::unique_ptr<httplib::ThreadPool> pool;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      pool = std::move(pool_);
    }
    if (pool != nullptr) pool->shutdown();
  }

 private:
  enum class Admission { kAdmitted, kServerFull, kClientFull };

  void Serve(int sock, SSL_CTX* ctx, const std::function<bool()>& running,
             const ProcessRequest& process) {
    SSL* ssl = nullptr;
    bool ok = true;
    if (ctx != nullptr) {
      ssl = SSL_new(ctx);
      ok = ssl != nullptr && SSL_set_fd(ssl, sock) == 1 &&
           Handshake(ssl, sock, absl::Now() + limits_.head_timeout);
    }
    if (ok) Requests(sock, ssl, running, process);
    if (ssl != nullptr) {
      (void)SSL_shutdown(ssl);  // best effort: the socket is non-blocking
      SSL_free(ssl);
    }
    LingeringClose(sock);
  }

  bool Requests(int sock, SSL* ssl, const std::function<bool()>& running,
                const ProcessRequest& process) {
    BoundedStream stream(sock, ssl, limits_.body_timeout);
    bool ok = true;
    for (int i = 0; i < limits_.max_requests_per_connection && running(); ++i) {
      // Wait for the request's first byte (a keep-alive connection may stay idle this long),
      // in slices so that a stopping server is not held up.
      const absl::Time idle_until =
          absl::Now() + (i == 0 ? limits_.head_timeout : limits_.keep_alive_timeout);
      bool readable = stream.has_buffered();
      while (!readable && running() && absl::Now() < idle_until) {
        readable =
            WaitFor(sock, POLLIN, std::min(idle_until, absl::Now() + absl::Milliseconds(100)));
      }
      if (!readable) break;
      tl_hit = LimitHit();
      stream.StartRequest();
      stream.Limit(
          limits_.max_head_bytes, absl::Now() + limits_.head_timeout, 431,
          absl::StrCat("the request line and headers (at most ", limits_.max_head_bytes,
                       " bytes, within ", absl::FormatDuration(limits_.head_timeout), ")"));
      bool closed = false;
      const bool last = i + 1 == limits_.max_requests_per_connection;
      ok = process(stream, last, closed, [&](httplib::Request& request) {
        // The head is in: the body (if any) has its own budget. Chunked framing adds a little.
        // A declared length over the limit gets none, so httplib's 413 comes at once rather
        // than after it has read and dropped the declared bytes.
        uint64_t declared = 0;
        const std::string length = request.get_header_value("Content-Length");
        const bool over = !length.empty() && (!absl::SimpleAtoi(length, &declared) ||
                                              declared > limits_.max_body_bytes);
        stream.Limit(
            over ? 0 : limits_.max_body_bytes + (64 << 10), absl::Now() + limits_.body_timeout, 413,
            absl::StrCat("the request body (at most ", limits_.max_body_bytes, " bytes, within ",
                         absl::FormatDuration(limits_.body_timeout), ")"));
      });
      if (stream.hit()) {
        // httplib gives up on a request line it could not read without answering.
        if (stream.written() == 0) WriteError(stream, tl_hit.status, tl_hit.message);
        break;
      }
      if (!ok || closed) break;
    }
    tl_hit = LimitHit();
    return ok;
  }

  static bool Handshake(SSL* ssl, int sock, absl::Time deadline) {
    for (;;) {
      const int r = SSL_accept(ssl);
      if (r == 1) return true;
      const int error = SSL_get_error(ssl, r);
      short events = 0;
      if (error == SSL_ERROR_WANT_READ) {
        events = POLLIN;
      } else if (error == SSL_ERROR_WANT_WRITE) {
        events = POLLOUT;
      } else {
        return false;
      }
      if (!WaitFor(sock, events, deadline)) return false;
    }
  }

  static std::string ErrorResponse(int status, const std::string& message) {
    const std::string body = ErrorJson(status, message);
    return absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status),
                        "\r\nContent-Type: application/json\r\nConnection: close\r\n",
                        status == 503 || status == 429 ? "Retry-After: 1\r\n" : "",
                        "Content-Length: ", body.size(), "\r\n\r\n", body);
  }

  static void WriteError(httplib::Stream& stream, int status, const std::string& message) {
    const std::string out = ErrorResponse(status, message);
    (void)stream.write(out.data(), out.size());
  }

  // Closing a socket with unread bytes makes the kernel reset the connection, which can
  // discard the answer (a 431) before the client reads it: the sending side is shut first and
  // what the client still sends is read and dropped, for a moment and a few bytes at most.
  static void LingeringClose(int sock) {
    ::shutdown(sock, SHUT_WR);
    const absl::Time until = absl::Now() + absl::Milliseconds(200);
    char sink[4096];
    size_t drained = 0;
    while (drained < (256 << 10) && WaitFor(sock, POLLIN, until)) {
      const ssize_t n = ::recv(sock, sink, sizeof(sink), 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
    ::close(sock);
  }

  // On the listening thread: answered without waiting (plain HTTP) or closed (TLS, where an
  // answer would need a handshake first).
  static void TurnAway(int sock, SSL_CTX* ctx, int status, const std::string& message) {
    if (ctx == nullptr) {
      const std::string out = ErrorResponse(status, message);
      (void)::send(sock, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    ::shutdown(sock, SHUT_WR);
    ::close(sock);
  }

  Admission Enter(const std::string& client) {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_ >= limits_.max_connections) return Admission::kServerFull;
    auto [it, created] = per_client_.try_emplace(client, 0);
    if (it->second >= limits_.max_connections_per_client) return Admission::kClientFull;
    ++it->second;
    ++open_;
    return Admission::kAdmitted;
  }
  void Leave(const std::string& client) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = per_client_.find(client);
    if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
    --open_;
  }

  const HttpLimits limits_;
  std::mutex mu_;
  std::map<std::string, int> per_client_;
  int open_ = 0;
  std::mutex pool_mu_;
  std::unique_ptr<httplib::ThreadPool> pool_;
};

// httplib's task queue, which runs each accepted socket's task on the listening thread: the
// task is ConnectionLoop::Admit, which hands admitted connections to the loop's own pool.
class AdmitOnListeningThread : public httplib::TaskQueue {
 public:
  explicit AdmitOnListeningThread(ConnectionLoop* loop) : loop_(loop) { loop_->StartPool(); }
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { loop_->StopPool(); }

 private:
  ConnectionLoop* const loop_;
};

// httplib listens with a backlog of 5, so a burst of connections (a page's parallel requests,
// or an attacker's) overflows it and clients wait for SYN retries (1 s, 3 s, ...), while the
// listening thread admits or turns away each connection in microseconds. Listening again on
// the bound socket raises the backlog.
void ListenDeeper(int sock) { (void)::listen(sock, 1024); }

// httplib's server (plain or TLS) with each accepted socket admitted and served by the loop.
template <typename Base>
class Bounded : public Base {
 public:
  template <typename... Args>
  explicit Bounded(const HttpLimits& limits, Args&&... args)
      : Base(std::forward<Args>(args)...), loop_(limits) {
    this->new_task_queue = [this] {
      ListenDeeper(this->svr_sock_);
      return new AdmitOnListeningThread(&loop_);
    };
  }

 private:
  bool process_and_close_socket(int sock) override {
    SSL_CTX* ctx = nullptr;
    if constexpr (std::is_base_of_v<httplib::SSLServer, Base>) ctx = this->ssl_context();
    loop_.Admit(
        sock, ctx, [this] { return this->svr_sock_ != INVALID_SOCKET; },
        [this](httplib::Stream& s, bool last, bool& closed,
               const std::function<void(httplib::Request&)>& setup) {
          return this->process_request(s, last, closed, setup);
        });
    return true;
  }

  ConnectionLoop loop_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<httplib::Server>> NewBoundedHttpServer(const HttpLimits& limits,
                                                                      const std::string& cert,
                                                                      const std::string& key) {
  std::unique_ptr<httplib::Server> server;
  if (!cert.empty() && !key.empty()) {
    auto tls = std::make_unique<Bounded<httplib::SSLServer>>(limits, cert.c_str(), key.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot serve HTTPS with ", cert, " and ", key));
    }
    server = std::move(tls);
  } else {
    server = std::make_unique<Bounded<httplib::Server>>(limits);
  }
  server->set_payload_max_length(limits.max_body_bytes);
  server->set_error_handler(
      [](const httplib::Request&, httplib::Response& response) { AnswerHttpLimitHit(response); });
  return server;
}

absl::string_view HttpLimitHit() { return tl_hit.message; }

bool AnswerHttpLimitHit(httplib::Response& response) {
  if (tl_hit.status == 0) return false;
  response.status = tl_hit.status;
  response.set_header("Connection", "close");
  response.set_content(ErrorJson(tl_hit.status, tl_hit.message), "application/json");
  return true;
}

}  // namespace dtrain

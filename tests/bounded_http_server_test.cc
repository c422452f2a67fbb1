// The HTTP servers' limits (common/bounded_http_server.h), attacked over real sockets on
// loopback as a hostile client would: an endless head or line, a client trickling bytes
// (slowloris), more connections than allowed from one address and from all, a body too large,
// and the same over TLS. Each attack gets its answer (431, 408, 429, 503, 413) or is cut off,
// the server's memory stays flat, and a well-behaved client is served throughout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bounded_http_server.h"
#include "tests/test_support.h"

namespace dtrain {
namespace bounded_http_server_test {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A bounded server with /hello and POST /echo, listening on 127.0.0.1.
class Served {
 public:
  explicit Served(const HttpLimits& limits, const std::string& cert = "",
                  const std::string& key = "") {
    absl::StatusOr<std::unique_ptr<httplib::Server>> made = NewBoundedHttpServer(limits, cert, key);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return;
    server_ = *std::move(made);
    server_->Get("/hello", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("hello", "text/plain");
    });
    server_->Post("/echo", [](const httplib::Request& q, httplib::Response& r) {
      r.set_content(q.body, "text/plain");
    });
    server_->Get("/big", [](const httplib::Request&, httplib::Response& r) {
      std::string body(32 << 20, '\0');
      for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 131 % 251);
      r.set_content(body, "application/octet-stream");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~Served() {
    if (server_ == nullptr) return;
    server_->stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// A TCP connection to 127.0.0.1:port from `source` (another loopback address is another
// client to the server).
int Connect(int port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0) << source;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// What the server sends until it closes, or `timeout` passes.
std::string ReadUntilClosed(int fd, absl::Duration timeout) {
  std::string out;
  const absl::Time until = absl::Now() + timeout;
  char buffer[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(until - absl::Now()));
    if (ms <= 0 || ::poll(&p, 1, ms) <= 0) break;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

std::string Hello(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  auto r = client.Get("/hello");
  return r ? absl::StrCat(r->status, " ", r->body) : "no answer";
}

TEST(BoundedHttpServer, EndlessHeadOrLine_431_MemoryFlat_OthersServed) {
  Served served{HttpLimits()};
  ASSERT_EQ(Hello(served.port()), "200 hello");
  const long before = testing::ResidentKiB(getpid());

  // 100 KiB of headers, then the client waits for the answer.
  {
    const int fd = Connect(served.port());
    std::string head = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    while (head.size() < (100 << 10))
      absl::StrAppend(&head, "X-Pad: ", std::string(1000, 'a'), "\r\n");
    ASSERT_TRUE(SendAll(fd, head + "\r\n"));
    const std::string answer = ReadUntilClosed(fd, absl::Seconds(5));
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 431 "));
    EXPECT_THAT(answer, HasSubstr("the request line and headers (at most 65536 bytes"));
    ::close(fd);
  }
  // One request line of 100 KiB without an end.
  {
    const int fd = Connect(served.port());
    ASSERT_TRUE(SendAll(fd, "GET /" + std::string(100 << 10, 'a')));
    const std::string answer = ReadUntilClosed(fd, absl::Seconds(5));
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 431 "));
    ::close(fd);
  }
  // 256 MiB of one header line, sent as fast as loopback goes: the server cuts it off.
  std::atomic<int64_t> sent{0};
  const absl::Time start = absl::Now();
  {
    const int fd = Connect(served.port());
    const std::string chunk(1 << 20, 'b');
    SendAll(fd, "GET /hello HTTP/1.1\r\nX-Flood: ");
    for (int i = 0; i < 256 && SendAll(fd, chunk); ++i) sent += chunk.size();
    ::close(fd);
  }
  EXPECT_LT(sent.load(), int64_t{64} << 20) << "the server kept reading the flood";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  const long after = testing::ResidentKiB(getpid());
  std::cout << "RSS " << before << " KiB before the attacks, " << after
            << " KiB after; the flood was cut after " << (sent.load() >> 10) << " KiB\n";
  EXPECT_LT(after - before, 16 << 10) << "RSS grew from " << before << " KiB to " << after;
  EXPECT_EQ(Hello(served.port()), "200 hello");
}

TEST(BoundedHttpServer, Slowloris_CutAtTheHeadDeadline_OthersServed) {
  HttpLimits limits;
  limits.head_timeout = absl::Seconds(1);
  Served served(limits);
  // A head trickled one header a 200 ms: answered 408 at the deadline, not at a read timeout.
  const int slow = Connect(served.port());
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    SendAll(slow, "GET /hello HTTP/1.1\r\n");
    while (!done && SendAll(slow, "X-Slow: 1\r\n")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ(Hello(served.port()), "200 hello") << "served while the slow client holds a thread";
  const std::string answer = ReadUntilClosed(slow, absl::Seconds(5));
  const absl::Duration took = absl::Now() - start;
  done = true;
  trickle.join();
  ::close(slow);
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 408 "));
  EXPECT_THAT(answer, HasSubstr("did not arrive in time"));
  EXPECT_GT(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(3));
  // A connection that never sends is closed at the same deadline.
  const int idle = Connect(served.port());
  const absl::Time idle_start = absl::Now();
  EXPECT_EQ(ReadUntilClosed(idle, absl::Seconds(5)), "");
  EXPECT_LT(absl::Now() - idle_start, absl::Seconds(3));
  ::close(idle);
}

TEST(BoundedHttpServer, ConnectionCaps_PerClientAndInTotal) {
  HttpLimits limits;
  limits.threads = 8;
  limits.max_connections = 6;
  limits.max_connections_per_client = 4;
  Served served(limits);
  std::vector<int> open;
  for (int i = 0; i < 4; ++i) open.push_back(Connect(served.port(), "127.0.0.1"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // each taken by a thread
  const int fifth = Connect(served.port(), "127.0.0.1");
  const std::string refused = ReadUntilClosed(fifth, absl::Seconds(5));
  ::close(fifth);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 429 "));
  EXPECT_THAT(refused, HasSubstr("127.0.0.1 has 4 connections open to this server"));
  for (int i = 0; i < 2; ++i) open.push_back(Connect(served.port(), "127.0.0.2"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int seventh = Connect(served.port(), "127.0.0.3");
  const std::string full = ReadUntilClosed(seventh, absl::Seconds(5));
  ::close(seventh);
  EXPECT_THAT(full, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(full, HasSubstr("this server has 6 connections open, its limit"));
  for (int fd : open) ::close(fd);
  // Once they are gone, everyone is served again.
  bool served_again = false;
  for (int i = 0; i < 50 && !served_again; ++i) {
    served_again = Hello(served.port()) == "200 hello";
    if (!served_again) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served_again);
}

TEST(BoundedHttpServer, BodyOverTheLimit_413_BodyWithin_Echoed) {
  HttpLimits limits;
  limits.max_body_bytes = 1 << 20;
  Served served(limits);
  httplib::Client client("127.0.0.1", served.port());
  auto big = client.Post("/echo", std::string((1 << 20) + 1, 'x'), "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  // A declared length over the limit is answered at once, without waiting for the bytes.
  const int fd = Connect(served.port());
  ASSERT_TRUE(SendAll(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n{"));
  const absl::Time start = absl::Now();
  const std::string declared = ReadUntilClosed(fd, absl::Seconds(5));
  ::close(fd);
  EXPECT_THAT(declared, StartsWith("HTTP/1.1 413 "));
  EXPECT_THAT(declared, HasSubstr("the request body (at most 1048576 bytes"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  auto fits = client.Post("/echo", std::string(1 << 20, 'y'), "text/plain");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200);
  EXPECT_EQ(fits->body.size(), size_t{1} << 20);
}

TEST(BoundedHttpServer, Tls_SameLimits_SlowHandshakeCut) {
  const std::string dir = testing::TestTempPath("bounded-tls");
  testing::CommandResult made = testing::RunShell(
      absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", dir, " 2>&1"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  HttpLimits limits;
  limits.head_timeout = absl::Seconds(1);
  Served served(limits, dir + "/server.pem", dir + "/server.key");
  httplib::SSLClient client("127.0.0.1", served.port());
  client.set_ca_cert_path((dir + "/ca.pem").c_str());
  client.enable_server_certificate_verification(true);
  auto hello = client.Get("/hello");
  ASSERT_TRUE(hello) << httplib::to_string(hello.error());
  EXPECT_EQ(hello->status, 200);
  EXPECT_EQ(hello->body, "hello");
  auto big = client.Get("/hello", {{"X-Pad", std::string(100 << 10, 'a')}});
  ASSERT_TRUE(big) << httplib::to_string(big.error());
  EXPECT_EQ(big->status, 431);
  EXPECT_THAT(big->body, HasSubstr("the request line and headers"));
  // A client that connects and never says hello is let go at the head deadline.
  const int silent = Connect(served.port());
  const absl::Time start = absl::Now();
  EXPECT_EQ(ReadUntilClosed(silent, absl::Seconds(5)), "");
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ::close(silent);
}

// A large answer arrives whole: the socket takes it in parts, and every part is sent (a short
// send once dropped the rest while Content-Length promised it).
TEST(BoundedHttpServer, LargeAnswer_ArrivesWhole) {
  Served served{HttpLimits()};
  httplib::Client client("127.0.0.1", served.port());
  client.set_read_timeout(30, 0);
  auto big = client.Get("/big");
  ASSERT_TRUE(big) << httplib::to_string(big.error());
  ASSERT_EQ(big->status, 200);
  ASSERT_EQ(big->body.size(), size_t{32} << 20);
  bool same = true;
  for (size_t i = 0; i < big->body.size() && same; ++i) {
    same = big->body[i] == static_cast<char>(i * 131 % 251);
  }
  EXPECT_TRUE(same);
}

}  // namespace bounded_http_server_test
}  // namespace dtrain

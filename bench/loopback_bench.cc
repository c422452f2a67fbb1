// dtrain-bench-loopback: this machine's physical limit for the collectives benchmark, measured
// in the same run: TCP over 127.0.0.1 between two threads, as a stream (bandwidth, large writes)
// and as 1-byte ping-pong (round trip). Prints JSON rows with system "loopback-tcp".
// Plain POSIX sockets: the probe must be what the collectives' bytes ride on, nothing more.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// A connected pair of loopback TCP sockets with Nagle off.
std::pair<int, int> ConnectedPair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("listen");
  }
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(client, reinterpret_cast<sockaddr*>(&addr), len) != 0) Die("connect");
  const int server = accept(listener, nullptr, nullptr);
  if (server < 0) Die("accept");
  close(listener);
  const int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {client, server};
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w <= 0) Die("write");
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, data, n);
    if (r <= 0) Die("read");
    data += r;
    n -= static_cast<size_t>(r);
  }
}

}  // namespace

int main() {
  // Stream: 4 MiB writes for about 2 s; the receiver drains into its own buffer.
  {
    auto [tx, rx] = ConnectedPair();
    constexpr size_t kChunk = size_t{4} << 20;
    std::vector<char> out(kChunk, 1), in(kChunk);
    size_t total = 0;
    std::thread receiver([&, rx = rx] {
      ssize_t r;
      while ((r = read(rx, in.data(), in.size())) > 0) {
      }
    });
    const auto start = Clock::now();
    while (Clock::now() - start < std::chrono::seconds(2)) {
      WriteAll(tx, out.data(), out.size());
      total += kChunk;
    }
    shutdown(tx, SHUT_WR);
    receiver.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    close(tx);
    close(rx);
    std::printf(
        "{\"system\": \"loopback-tcp\", \"op\": \"stream\", \"ranks\": 2, \"bytes\": %zu, "
        "\"p50_us\": 0, \"p99_us\": 0, \"algbw_gbps\": %.4f}\n",
        total, total / seconds / 1e9);
  }
  // Round trip: 1 byte there and back, 200 warm-up + 5000 timed.
  {
    auto [a, b] = ConnectedPair();
    std::thread echo([b = b] {
      char c;
      for (int i = 0; i < 5200; ++i) {
        ReadAll(b, &c, 1);
        WriteAll(b, &c, 1);
      }
    });
    std::vector<double> us;
    char c = 'x';
    for (int i = 0; i < 5200; ++i) {
      const auto start = Clock::now();
      WriteAll(a, &c, 1);
      ReadAll(a, &c, 1);
      if (i >= 200)
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    echo.join();
    close(a);
    close(b);
    std::sort(us.begin(), us.end());
    std::printf(
        "{\"system\": \"loopback-tcp\", \"op\": \"round_trip\", \"ranks\": 2, \"bytes\": 1, "
        "\"p50_us\": %.1f, \"p99_us\": %.1f, \"algbw_gbps\": 0}\n",
        us[us.size() / 2], us[us.size() * 99 / 100]);
  }
  return 0;
}

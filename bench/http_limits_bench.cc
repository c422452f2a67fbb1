// What the HTTP servers' limits cost (common/bounded_http_server.h): requests per second for a
// small JSON answer through the bounded server and through cpp-httplib's own server, side by
// side in one process, in alternating rounds so that both see the same machine. Keep-alive
// clients (a dashboard, a script polling the API) and a new connection per request (curl).
// Prints one JSON object per row.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/bounded_http_server.h"

ABSL_FLAG(int, clients, 4, "client threads");
ABSL_FLAG(double, seconds, 2.0, "seconds per round and server");
ABSL_FLAG(int, rounds, 3, "alternating rounds");

namespace {

std::unique_ptr<httplib::Server> Serve(std::unique_ptr<httplib::Server> server, int* port,
                                       std::thread* thread) {
  const std::string body(2048, 'x');
  server->Get("/api", [body](const httplib::Request&, httplib::Response& r) {
    r.set_content(body, "application/json");
  });
  *port = server->bind_to_any_port("127.0.0.1");
  httplib::Server* raw = server.get();
  *thread = std::thread([raw] { raw->listen_after_bind(); });
  while (!server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return server;
}

// Requests per second answered 200 by `port` with `clients` threads for `seconds`.
double Rate(int port, int clients, double seconds, bool keep_alive) {
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> failed{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      std::unique_ptr<httplib::Client> client;
      while (!stop) {
        if (client == nullptr || !keep_alive) {
          client = std::make_unique<httplib::Client>("127.0.0.1", port);
          client->set_keep_alive(keep_alive);
        }
        auto r = client->Get("/api");
        if (r && r->status == 200) {
          ++done;
        } else {
          ++failed;
        }
      }
    });
  }
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed > 0) std::fprintf(stderr, "%lld requests failed\n", static_cast<long long>(failed));
  return static_cast<double>(done) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_clients);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  int plain_port = 0, bounded_port = 0;
  std::thread plain_thread, bounded_thread;
  // The peer at its best: cpp-httplib's server with TCP_NODELAY, as dtrain's sets it.
  auto peer = std::make_unique<httplib::Server>();
  peer->set_tcp_nodelay(true);
  auto plain = Serve(std::move(peer), &plain_port, &plain_thread);
  auto bounded_made = dtrain::NewBoundedHttpServer(dtrain::HttpLimits());
  if (!bounded_made.ok()) return 1;
  auto bounded = Serve(*std::move(bounded_made), &bounded_port, &bounded_thread);
  for (bool keep_alive : {true, false}) {
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      const double p = Rate(plain_port, clients, seconds, keep_alive);
      const double b = Rate(bounded_port, clients, seconds, keep_alive);
      std::printf(
          "{\"connections\": \"%s\", \"round\": %d, \"clients\": %d, \"httplib_rps\": %.0f, "
          "\"bounded_rps\": %.0f, \"ratio\": %.3f}\n",
          keep_alive ? "keep-alive" : "one per request", round, clients, p, b, b / p);
      std::fflush(stdout);
    }
  }
  plain->stop();
  bounded->stop();
  plain_thread.join();
  bounded_thread.join();
  return 0;
}

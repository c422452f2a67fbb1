// cpp-httplib servers whose every connection is bounded before anyone is authenticated.
// Debian's cpp-httplib 0.11.4 reads a request line or header line of any length into a growing
// string, any number of headers, and waits for each byte with a per-read timeout only, so one
// client can grow the process without limit or hold a thread forever (slowloris); its thread
// pool queues connections without limit. It has no setting for these, so dtrain's servers run
// each connection through their own loop over httplib's protected process_request, reading
// through a stream that enforces a byte budget and an absolute deadline per request (TLS with
// OpenSSL directly, using the SSLServer's own context), and cap open connections in total and
// per client address. Used by the dashboard/API server and the /metrics endpoints.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace dtrain {

struct HttpLimits {
  // The request line and headers together: past it the request gets 431 and the connection
  // closes. Browsers send 1-8 KiB.
  size_t max_head_bytes = 64 << 10;
  // A body; a larger declared Content-Length gets 413 before anything is read.
  size_t max_body_bytes = 1 << 20;
  // The whole head (and a TLS handshake) must arrive within this from the request's first byte
  // being awaited: a client that trickles bytes is cut off here (408).
  absl::Duration head_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  // How long an idle keep-alive connection is kept, and how many requests it may carry.
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  int max_requests_per_connection = 100;
  // Threads serving connections (a live event stream holds one for its life), connections open
  // at once (beyond the threads they wait in a queue), and open connections per client address.
  // One client's share stays well below the threads, so that it cannot hold them all for the
  // head timeout.
  int threads = 64;
  int max_connections = 256;
  int max_connections_per_client = 16;
};

// A server enforcing `limits`; HTTPS when `cert` and `key` are given (INVALID_ARGUMENT when they
// cannot be loaded). Routes, handlers and binding are httplib's as usual.
absl::StatusOr<std::unique_ptr<httplib::Server>> NewBoundedHttpServer(const HttpLimits& limits,
                                                                      const std::string& cert = "",
                                                                      const std::string& key = "");

// Inside a handler or error handler on a bounded server's thread: which limit the current
// request ran into ("" when none), so an error handler can say it (431, 408).
absl::string_view HttpLimitHit();

// For an error handler: when the current request ran into a limit, sets `response` to its
// status (431 too large, 408 too slow, 413 body) and a JSON error naming the limit, and returns
// true. A bounded server's default error handler does this; one set later should call it first.
bool AnswerHttpLimitHit(httplib::Response& response);

}  // namespace dtrain

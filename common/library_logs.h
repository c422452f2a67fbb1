// gRPC's and protobuf's own log messages, written through dtrain's log (common/log.h) instead of
// straight to stderr: with --log_format=json every line stays one JSON record. A client can make
// either library log at will (protobuf logs every string field that is not UTF-8 as it refuses
// the request; gRPC logs every failed TLS handshake), so each call site in the libraries writes at
// most one record a second, and its next record says how many it dropped meanwhile.
#pragma once

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"

namespace dtrain {

// Routes both libraries' messages into the log for the rest of the process. Call once at start-up,
// before any server or channel exists (protobuf's handler is not safe to swap later).
void RouteLibraryLogs();

// The level a library's message is recorded at: the library's own, except that bytes that are
// not UTF-8 in a request protobuf parsed (a client's fault, refused with INVALID_ARGUMENT) are a
// warning, not an error: an alert on errors must not fire on any client's mistake.
LogLevel ProtobufRecordLevel(google::protobuf::LogLevel level, absl::string_view message);
LogLevel GrpcRecordLevel(gpr_log_severity severity);

// At most one record per call site per `interval`; the others are counted, and the count goes with
// the site's next record. A library's assertion is never dropped: the process is about to abort.
class LogSiteLimiter {
 public:
  explicit LogSiteLimiter(absl::Duration interval) : interval_(interval) {}

  // Whether a record from `site` may be written at `now`; when it may, *dropped is how many of
  // the site's records were dropped since its last one.
  bool Admit(absl::string_view site, absl::Time now, int64_t* dropped);

 private:
  // Call sites are lines of the libraries' code: a few hundred at most. Past this many, new sites
  // share one entry, so the map cannot grow without bound whatever is logged.
  static constexpr size_t kMostSites = 4096;

  struct Site {
    absl::Time last = absl::InfinitePast();
    int64_t dropped = 0;
  };
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Site> sites_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain

// RouteLibraryLogs and LogSiteLimiter (library_logs.h).
#include "common/library_logs.h"

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dtrain {
namespace {

// A message longer than this is cut: a library may quote what a client sent.
constexpr size_t kMostMessageBytes = 1000;

LogSiteLimiter& Limiter() {
  static LogSiteLimiter* const limiter = new LogSiteLimiter(absl::Seconds(1));
  return *limiter;
}

void Write(LogLevel level, const char* library, const char* file, int line,
           absl::string_view message, bool always) {
  if (!LogEnabled(level)) return;
  const std::string site = absl::StrCat(file != nullptr ? file : "?", ":", line);
  int64_t dropped = 0;
  if (!always && !Limiter().Admit(site, absl::Now(), &dropped)) return;
  const absl::string_view shown = message.substr(0, kMostMessageBytes);
  const std::string text =
      absl::StrCat(library, ": ", shown, message.size() > shown.size() ? "..." : "");
  if (dropped > 0) {
    Log(level, text, {{"library", library}, {"source", site}, {"dropped_since_last", dropped}});
  } else {
    Log(level, text, {{"library", library}, {"source", site}});
  }
}

}  // namespace

LogLevel ProtobufRecordLevel(google::protobuf::LogLevel level, absl::string_view message) {
  if (level == google::protobuf::LOGLEVEL_INFO) return LogLevel::kInfo;
  if (level == google::protobuf::LOGLEVEL_WARNING) return LogLevel::kWarning;
  // protobuf calls a string that is not UTF-8 an error whichever side it is on. Parsing, the
  // bytes are a peer's, already refused with INVALID_ARGUMENT: the daemon did nothing wrong, and
  // an operator's alert on errors would fire on any client's fault. Serializing, they are ours.
  if (level == google::protobuf::LOGLEVEL_ERROR &&
      absl::StrContains(message, "when parsing a protocol buffer")) {
    return LogLevel::kWarning;
  }
  return LogLevel::kError;
}

LogLevel GrpcRecordLevel(gpr_log_severity severity) {
  if (severity == GPR_LOG_SEVERITY_DEBUG) return LogLevel::kDebug;
  if (severity == GPR_LOG_SEVERITY_INFO) return LogLevel::kInfo;
  // A failed TLS handshake stays an error: a client whose CA does not trust its server logs the
  // same text as a server refusing a port scanner, and that client may never get in.
  return LogLevel::kError;
}

namespace {

void FromProtobuf(google::protobuf::LogLevel level, const char* file, int line,
                  const std::string& message) {
  // protobuf aborts after a FATAL message itself; that one is always written.
  const bool fatal = level == google::protobuf::LOGLEVEL_FATAL;
  Write(ProtobufRecordLevel(level, message), "protobuf", file, line, message, fatal);
}

void FromGrpc(gpr_log_func_args* args) {
  const absl::string_view message = args->message != nullptr ? args->message : "";
  const LogLevel ours = GrpcRecordLevel(args->severity);
  // GPR_ASSERT writes "assertion failed: ..." and then aborts: never dropped.
  Write(ours, "grpc", args->file, args->line, message,
        absl::StartsWith(message, "assertion failed"));
}

}  // namespace

bool LogSiteLimiter::Admit(absl::string_view site, absl::Time now, int64_t* dropped) {
  absl::MutexLock lock(&mu_);
  auto it = sites_.find(site);
  if (it == sites_.end()) {
    it = sites_.size() < kMostSites ? sites_.try_emplace(std::string(site)).first
                                    : sites_.try_emplace("(other sites)").first;
  }
  Site& s = it->second;
  if (now - s.last < interval_) {
    ++s.dropped;
    return false;
  }
  *dropped = s.dropped;
  s.dropped = 0;
  s.last = now;
  return true;
}

void RouteLibraryLogs() {
  google::protobuf::SetLogHandler(&FromProtobuf);
  gpr_set_log_function(&FromGrpc);
}

}  // namespace dtrain

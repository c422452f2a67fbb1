#include "common/log_flags.h"

#include "absl/flags/flag.h"
#include "common/library_logs.h"
#include "common/log.h"

ABSL_FLAG(std::string, log_level, "info",
          "the least severe log records written to stderr: debug, info, warning or error");
ABSL_FLAG(std::string, log_format, "text",
          "text (for people) or json (one object per line, for log pipelines)");

namespace dtrain {

absl::Status ConfigureLoggingFromFlags(const std::string& program) {
  absl::StatusOr<LogLevel> level = ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) return level.status();
  absl::StatusOr<LogFormat> format = ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!format.ok()) return format.status();
  LogOptions options;
  options.program = program;
  options.min_level = *level;
  options.format = *format;
  ConfigureLogging(std::move(options));
  RouteLibraryLogs();
  return absl::OkStatus();
}

}  // namespace dtrain

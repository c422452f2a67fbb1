// The daemons' and the CLI's log: one record per line on stderr, with a level, the program's
// name and key=value fields (job, group, worker, rank...) that a log pipeline can index. Text
// for people (the default), or JSON lines (--log_format=json) for journald, Loki, Elasticsearch
// or `kubectl logs | jq`. Records below --log_level are dropped before they are formatted.
//
// Thread-safety: every function may be called from any thread; records of different threads
// never interleave.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dtrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText, kJson };

// One field of a record: a string (quoted in JSON) or a number (not quoted).
struct LogField {
  LogField(absl::string_view k, absl::string_view v) : key(k), value(v) {}
  LogField(absl::string_view k, const char* v) : key(k), value(v) {}
  LogField(absl::string_view k, const std::string& v) : key(k), value(v) {}
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  LogField(absl::string_view k, T v) : key(k), value(absl::StrCat(v)), number(true) {}

  absl::string_view key;
  std::string value;
  bool number = false;
};

struct LogOptions {
  std::string program = "dtrain";  // e.g. dtrain-coordinator
  LogLevel min_level = LogLevel::kInfo;
  LogFormat format = LogFormat::kText;
};

// Applies to every later record; call once at start-up (the default is text at info).
void ConfigureLogging(LogOptions options);
LogOptions CurrentLogOptions();
bool LogEnabled(LogLevel level);

void Log(LogLevel level, absl::string_view message, std::initializer_list<LogField> fields = {});
inline void LogDebug(absl::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kDebug, message, fields);
}
inline void LogInfo(absl::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kInfo, message, fields);
}
inline void LogWarning(absl::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kWarning, message, fields);
}
inline void LogError(absl::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kError, message, fields);
}

// The record as it would be written (without the newline): for tests and for Log itself.
std::string FormatLogRecord(const LogOptions& options, absl::Time time, LogLevel level,
                            absl::string_view message, std::initializer_list<LogField> fields);

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text);
absl::string_view LogLevelName(LogLevel level);

}  // namespace dtrain

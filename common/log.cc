#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace {

absl::Mutex config_mu;
LogOptions& Config() ABSL_EXCLUSIVE_LOCKS_REQUIRED(config_mu) {
  static LogOptions* options = new LogOptions();
  return *options;
}
// Read on every record without the lock: the level check must be cheap.
std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

// Length of the valid UTF-8 sequence at s[i], or 0.
size_t Utf8Length(absl::string_view s, size_t i) {
  const unsigned char c = s[i];
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// JSON string contents: escapes, control characters as \u00XX, bytes that are not UTF-8 as
// U+FFFD, so that a record is always valid JSON whatever a user put in a name.
void AppendJsonEscaped(std::string* out, absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    switch (c) {
      case '"':
        out->append("\\\"");
        ++i;
        continue;
      case '\\':
        out->append("\\\\");
        ++i;
        continue;
      case '\n':
        out->append("\\n");
        ++i;
        continue;
      case '\r':
        out->append("\\r");
        ++i;
        continue;
      case '\t':
        out->append("\\t");
        ++i;
        continue;
      default:
        break;
    }
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
      ++i;
      continue;
    }
    const size_t n = Utf8Length(s, i);
    if (n == 0) {
      out->append("\\ufffd");
      ++i;
    } else {
      out->append(s.data() + i, n);
      i += n;
    }
  }
}

// Text: a message or value stays on one line; a value is quoted when it has spaces, quotes,
// '=' or nothing, so that `key=value` pairs split unambiguously (logfmt).
void AppendTextEscaped(std::string* out, absl::string_view s) {
  for (const char ch : s) {
    const unsigned char c = ch;
    if (c == '\n') {
      out->append("\\n");
    } else if (c == '"') {
      out->append("\\\"");
    } else if (c == '\\') {
      out->append("\\\\");
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out->append(buf);
    } else {
      out->push_back(ch);
    }
  }
}

bool NeedsQuotes(absl::string_view s) {
  if (s.empty()) return true;
  for (const char c : s) {
    if (c == ' ' || c == '"' || c == '=' || static_cast<unsigned char>(c) < 0x20) return true;
  }
  return false;
}

}  // namespace

void ConfigureLogging(LogOptions options) {
  absl::MutexLock lock(&config_mu);
  min_level = static_cast<int>(options.min_level);
  Config() = std::move(options);
}

LogOptions CurrentLogOptions() {
  absl::MutexLock lock(&config_mu);
  return Config();
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= min_level.load(); }

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (lower == LogLevelName(level)) return level;
  }
  if (lower == "warn") return LogLevel::kWarning;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_level: '", text, "' is not one of debug, info, warning, error"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "text") return LogFormat::kText;
  if (lower == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format: '", text, "' is not one of text, json"));
}

std::string FormatLogRecord(const LogOptions& options, absl::Time time, LogLevel level,
                            absl::string_view message, std::initializer_list<LogField> fields) {
  // RFC 3339 in UTC with milliseconds: sortable, and what log pipelines parse by default.
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
  std::string out;
  out.reserve(96 + message.size());
  if (options.format == LogFormat::kJson) {
    absl::StrAppend(&out, "{\"ts\":\"", ts, "\",\"level\":\"", LogLevelName(level),
                    "\",\"program\":\"");
    AppendJsonEscaped(&out, options.program);
    out.append("\",\"msg\":\"");
    AppendJsonEscaped(&out, message);
    out.push_back('"');
    for (const LogField& f : fields) {
      out.append(",\"");
      AppendJsonEscaped(&out, f.key);
      out.append("\":");
      if (f.number) {
        out.append(f.value);
      } else {
        out.push_back('"');
        AppendJsonEscaped(&out, f.value);
        out.push_back('"');
      }
    }
    out.push_back('}');
    return out;
  }
  std::string level_name = absl::AsciiStrToUpper(LogLevelName(level));
  level_name.resize(7, ' ');  // aligned columns
  absl::StrAppend(&out, ts, " ", level_name, " ", options.program, ": ");
  AppendTextEscaped(&out, message);
  for (const LogField& f : fields) {
    out.push_back(' ');
    AppendTextEscaped(&out, f.key);
    out.push_back('=');
    if (NeedsQuotes(f.value)) {
      out.push_back('"');
      AppendTextEscaped(&out, f.value);
      out.push_back('"');
    } else {
      AppendTextEscaped(&out, f.value);
    }
  }
  return out;
}

void Log(LogLevel level, absl::string_view message, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  // Formatted and written under the lock: records never interleave, whatever their length.
  absl::MutexLock lock(&config_mu);
  std::string record = FormatLogRecord(Config(), absl::Now(), level, message, fields);
  record.push_back('\n');
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(STDERR_FILENO, record.data() + done, record.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

}  // namespace dtrain

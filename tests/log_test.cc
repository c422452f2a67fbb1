// The structured log's records: text and JSON formats, escaping, levels; the limit on records
// from one call site of gRPC or protobuf.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/library_logs.h"
#include "common/log.h"

namespace dtrain {
namespace log_test {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kTime = absl::FromUnixMillis(1795000000123);  // 2026-11-18T11:06:40.123Z

LogOptions Options(LogFormat format) {
  LogOptions options;
  options.program = "dtrain-worker";
  options.format = format;
  return options;
}

TEST(LogTest, Text_TimestampLevelProgramMessageAndFields) {
  EXPECT_EQ(FormatLogRecord(Options(LogFormat::kText), kTime, LogLevel::kWarning,
                            "worker 'w1' lost", {{"worker", "w1"}, {"devices", 2}}),
            "2026-11-18T11:06:40.123Z WARNING dtrain-worker: worker 'w1' lost worker=w1 devices=2");
}

TEST(LogTest, Text_ValuesWithSpacesOrQuotesAreQuoted_NewlinesEscaped) {
  EXPECT_EQ(
      FormatLogRecord(Options(LogFormat::kText), kTime, LogLevel::kInfo, "two\nlines",
                      {{"reason", "a \"b\" = c"}, {"empty", ""}}),
      "2026-11-18T11:06:40.123Z INFO    dtrain-worker: two\\nlines reason=\"a \\\"b\\\" = c\" "
      "empty=\"\"");
}

TEST(LogTest, Json_NumbersUnquoted_StringsEscaped) {
  EXPECT_EQ(FormatLogRecord(Options(LogFormat::kJson), kTime, LogLevel::kInfo, "group formed",
                            {{"group", "job-1"}, {"world_size", 2}, {"loss", 0.5}}),
            "{\"ts\":\"2026-11-18T11:06:40.123Z\",\"level\":\"info\",\"program\":\"dtrain-worker\","
            "\"msg\":\"group formed\",\"group\":\"job-1\",\"world_size\":2,\"loss\":0.5}");
}

TEST(LogTest, Json_ControlCharactersAndBadUtf8StayValidJson) {
  const std::string message = std::string("tab\there \"q\" back\\slash bell\a bad\xff ok\xc3\xa9");
  EXPECT_EQ(
      FormatLogRecord(Options(LogFormat::kJson), kTime, LogLevel::kError, message, {}),
      "{\"ts\":\"2026-11-18T11:06:40.123Z\",\"level\":\"error\",\"program\":\"dtrain-worker\","
      "\"msg\":\"tab\\there \\\"q\\\" back\\\\slash bell\\u0007 bad\\ufffd ok\xc3\xa9\"}");
}

TEST(LogTest, ParseLevelAndFormat_RejectUnknownNamingTheFlag) {
  EXPECT_EQ(*ParseLogLevel("WARNING"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_THAT(std::string(ParseLogLevel("verbose").status().message()),
              HasSubstr("--log_level: 'verbose' is not one of debug, info, warning, error"));
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_THAT(std::string(ParseLogFormat("xml").status().message()), HasSubstr("--log_format"));
}

TEST(LogTest, LevelsBelowTheMinimumAreDropped) {
  LogOptions options = Options(LogFormat::kText);
  options.min_level = LogLevel::kWarning;
  ConfigureLogging(options);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kWarning));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  ::testing::internal::CaptureStderr();
  LogInfo("dropped");
  LogError("kept", {{"job", "j"}});
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(out, Not(HasSubstr("dropped")));
  EXPECT_THAT(out, HasSubstr("ERROR   dtrain-worker: kept job=j\n"));
  ConfigureLogging(LogOptions());
}

TEST(LogSiteLimiterTest, OneRecordASecondPerSite_TheNextSaysHowManyWereDropped) {
  LogSiteLimiter limiter(absl::Seconds(1));
  int64_t dropped = -1;
  ASSERT_TRUE(limiter.Admit("wire_format_lite.cc:618", kTime, &dropped));
  EXPECT_EQ(dropped, 0);
  for (int i = 1; i <= 250; ++i) {
    EXPECT_FALSE(limiter.Admit("wire_format_lite.cc:618", kTime + absl::Milliseconds(i), &dropped));
  }
  // Another site is not held back by the first.
  ASSERT_TRUE(limiter.Admit("ssl_transport_security.cc:1446", kTime, &dropped));
  EXPECT_EQ(dropped, 0);
  EXPECT_FALSE(limiter.Admit("wire_format_lite.cc:618", kTime + absl::Milliseconds(999), &dropped));
  ASSERT_TRUE(limiter.Admit("wire_format_lite.cc:618", kTime + absl::Seconds(1), &dropped));
  EXPECT_EQ(dropped, 251);
  ASSERT_TRUE(limiter.Admit("wire_format_lite.cc:618", kTime + absl::Seconds(3), &dropped));
  EXPECT_EQ(dropped, 0);
}

TEST(LogSiteLimiterTest, ManySites_ThePastTheBoundShareOneEntry) {
  LogSiteLimiter limiter(absl::Seconds(1));
  int64_t dropped = 0;
  for (int i = 0; i < 4096; ++i) {
    ASSERT_TRUE(limiter.Admit(absl::StrCat("site:", i), kTime, &dropped)) << i;
  }
  // Sites past the bound are one: the first is written, the next dropped in the same second.
  EXPECT_TRUE(limiter.Admit("site:5000", kTime, &dropped));
  EXPECT_FALSE(limiter.Admit("site:5001", kTime, &dropped));
  EXPECT_FALSE(limiter.Admit("site:5002", kTime, &dropped));
  ASSERT_TRUE(limiter.Admit("site:5003", kTime + absl::Seconds(1), &dropped));
  EXPECT_EQ(dropped, 2);
  // A site within the bound keeps its own entry.
  EXPECT_FALSE(limiter.Admit("site:7", kTime, &dropped));
}

// A request's bytes that are not UTF-8 are a warning; the rest keeps the library's own level.
TEST(LibraryLogLevelTest, AClientsBadUtf8IsAWarning_OursStaysAnError) {
  // protobuf 3.21's text (wire_format_lite.cc), parsing and serializing.
  const std::string parsing =
      "String field 'dtrain.v1.GetJobRequest.id' contains invalid UTF-8 data when parsing a "
      "protocol buffer. Use the 'bytes' type if you intend to send raw bytes. ";
  std::string serializing = parsing;
  serializing.replace(serializing.find("parsing"), 7, "serializing");
  EXPECT_EQ(ProtobufRecordLevel(google::protobuf::LOGLEVEL_ERROR, parsing), LogLevel::kWarning);
  EXPECT_EQ(ProtobufRecordLevel(google::protobuf::LOGLEVEL_ERROR, serializing), LogLevel::kError);
  EXPECT_EQ(
      ProtobufRecordLevel(google::protobuf::LOGLEVEL_ERROR, "File already exists in database"),
      LogLevel::kError);
  EXPECT_EQ(ProtobufRecordLevel(google::protobuf::LOGLEVEL_FATAL, parsing), LogLevel::kError);
  EXPECT_EQ(ProtobufRecordLevel(google::protobuf::LOGLEVEL_WARNING, "x"), LogLevel::kWarning);
  EXPECT_EQ(ProtobufRecordLevel(google::protobuf::LOGLEVEL_INFO, "x"), LogLevel::kInfo);
  // A failed TLS handshake stays an error: a client that does not trust its server logs it too.
  EXPECT_EQ(GrpcRecordLevel(GPR_LOG_SEVERITY_ERROR), LogLevel::kError);
  EXPECT_EQ(GrpcRecordLevel(GPR_LOG_SEVERITY_INFO), LogLevel::kInfo);
  EXPECT_EQ(GrpcRecordLevel(GPR_LOG_SEVERITY_DEBUG), LogLevel::kDebug);
}

}  // namespace log_test
}  // namespace dtrain

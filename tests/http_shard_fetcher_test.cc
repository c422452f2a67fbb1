// FetchUrlToFile against a real nginx (Debian's, started per test on 127.0.0.1 and always reaped)
// for what a web server answers: the shard's exact bytes, digests, retries or none by status,
// Retry-After, size limits, redirects, cancel during a backoff, https with a CA file, and a
// presigned URL's secret in no message and no log; and which URLs are fetched over HTTP and
// how they are redacted. A broken server: http_shard_fetcher_broken_server_test.cc. Timeouts and
// backoffs are milliseconds so the whole suite runs in a few seconds.
#include "worker/data/http_shard_fetcher.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/http_shard_fetcher_fixture.h"
#include "tests/test_support.h"

namespace dtrain {
namespace http_shard_fetcher_test {

using ::dtrain::testing::ReadFile;
using ::dtrain::testing::TestTempPath;

constexpr int64_t kBigFileBytes = int64_t{5} << 20;

class NginxFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestTempPath("nginx");
    std::filesystem::remove_all(dir_);  // a fresh access log under --gtest_repeat too
    std::filesystem::create_directories(dir_ + "/www");
    std::filesystem::create_directories(dir_ + "/out");
    big_ = RandomBytes(kBigFileBytes, 36);
    WriteFile(dir_ + "/www/shard-000.tar", big_);
    std::string error;
    nginx_ = NginxServer::Start(dir_,
                                "    location = /forbidden.tar { return 403; }\n"
                                "    location = /unavailable.tar { return 503; }\n"
                                "    location = /busy.tar {\n"
                                "      add_header Retry-After 1 always;\n"
                                "      return 429;\n    }\n"
                                "    location = /very-busy.tar {\n"
                                "      add_header Retry-After 30 always;\n"
                                "      return 429;\n    }\n"
                                "    location = /moved.tar { return 302 /shard-000.tar; }\n"
                                "    location = /to-ftp.tar { return 302 ftp://127.0.0.1/x; }\n",
                                "", &error);
    ASSERT_NE(nginx_, nullptr) << error;
  }

  std::string Dest() const { return dir_ + "/out/shard.tar"; }
  bool DestExists() const { return std::filesystem::exists(Dest()); }
  int SpoolFiles() const { return FilesContaining(dir_ + "/out", ".part-"); }

  std::string dir_;
  std::string big_;
  std::unique_ptr<NginxServer> nginx_;
};

TEST(HttpUrlTest, IsHttpUrl_SchemesAnyCase_OnlyHttpAndHttps) {
  EXPECT_TRUE(IsHttpUrl("http://host/a.tar"));
  EXPECT_TRUE(IsHttpUrl("https://host/a.tar"));
  EXPECT_TRUE(IsHttpUrl("HTTPS://host/a.tar"));
  EXPECT_TRUE(IsHttpUrl("Http://host/a.tar"));
  EXPECT_FALSE(IsHttpUrl("ftp://host/a.tar"));
  EXPECT_FALSE(IsHttpUrl("file:///data/a.tar"));
  EXPECT_FALSE(IsHttpUrl("worker:/data/a.tar"));
  EXPECT_FALSE(IsHttpUrl("/data/http://a.tar"));
  EXPECT_FALSE(IsHttpUrl("https:/host/a.tar"));
}

TEST(HttpUrlTest, RedactUrl_QueryFragmentAndUserInfo_Hidden) {
  EXPECT_EQ(RedactUrl("https://b.s3.amazonaws.com/s-000.tar?X-Amz-Signature=secret"),
            "https://b.s3.amazonaws.com/s-000.tar?<redacted>");
  EXPECT_EQ(RedactUrl("https://user:secret@host:8443/a/b.tar"),
            "https://<redacted>@host:8443/a/b.tar");
  EXPECT_EQ(RedactUrl("http://host/a.tar#secret"), "http://host/a.tar#<redacted>");
  EXPECT_EQ(RedactUrl("http://host/a@b.tar"), "http://host/a@b.tar");
  EXPECT_EQ(RedactUrl("http://host/a.tar"), "http://host/a.tar");
}

TEST_F(NginxFetchTest, RightDigest_FileHasExactlyTheServedBytes) {
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), DigestOf(big_), FastOptions());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kBigFileBytes);
  EXPECT_TRUE(ReadFile(Dest()) == big_) << "the downloaded file differs from the served one";
  absl::StatusOr<std::string> digest = Sha256OfFile(Dest());
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, DigestOf(big_));
  EXPECT_EQ(SpoolFiles(), 0);
  EXPECT_EQ(nginx_->Requests("/shard-000.tar", 1), 1);
  std::printf("5 MiB over loopback in %s\n", absl::FormatDuration(absl::Now() - start).c_str());
}

TEST_F(NginxFetchTest, FourThreadsAtOnce_EachGetsTheWholeShard) {
  constexpr int kThreads = 4;
  std::vector<absl::StatusOr<int64_t>> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      results[i] =
          FetchUrlToFile(nginx_->Url("/shard-000.tar"), absl::StrCat(dir_, "/out/copy-", i, ".tar"),
                         DigestOf(big_), FastOptions());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(*results[i], kBigFileBytes);
    EXPECT_TRUE(ReadFile(absl::StrCat(dir_, "/out/copy-", i, ".tar")) == big_) << i;
  }
  EXPECT_EQ(nginx_->Requests("/shard-000.tar", kThreads), kThreads);
}

TEST_F(NginxFetchTest, NoDigest_FetchedAndOverwritesAnOldFile) {
  WriteFile(Dest(), "stale");
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), "", FastOptions());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kBigFileBytes);
  EXPECT_TRUE(ReadFile(Dest()) == big_);
}

TEST_F(NginxFetchTest, WrongDigest_DataLossAfterOneRetryAndNoFile) {
  const std::string wrong = DigestOf("not the shard");
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), wrong, FastOptions());
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kDataLoss) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "digest mismatch"));
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), wrong));
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), DigestOf(big_)));
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(2 tries)")) << bytes.status();
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
  EXPECT_EQ(nginx_->Requests("/shard-000.tar", 2), 2);  // retried exactly once
}

TEST_F(NginxFetchTest, Missing_NotFoundNamingUrlWithoutRetry) {
  const std::string url = nginx_->Url("/shard-404.tar");
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(url, Dest(), "", FastOptions());
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kNotFound) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), url)) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "HTTP 404")) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(1 try)")) << bytes.status();
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
  EXPECT_EQ(nginx_->Requests("/shard-404.tar", 1), 1);
}

TEST_F(NginxFetchTest, Forbidden_PermissionDeniedWithoutRetry) {
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/forbidden.tar"), Dest(), "", FastOptions());
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kPermissionDenied) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "HTTP 403")) << bytes.status();
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(nginx_->Requests("/forbidden.tar", 1), 1);
}

TEST_F(NginxFetchTest, ServiceUnavailable_RetriedMaxAttemptsThenUnavailable) {
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 4;
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/unavailable.tar"), Dest(), "", options);
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kUnavailable) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "HTTP 503")) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(4 tries)")) << bytes.status();
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
  EXPECT_EQ(nginx_->Requests("/unavailable.tar", 4), 4);
}

TEST_F(NginxFetchTest, TooManyRequestsWithRetryAfter_WaitsAsToldUpToMaxBackoff) {
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 2;
  options.max_backoff = absl::Seconds(10);  // the 10 ms backoff alone would retry at once
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(nginx_->Url("/busy.tar"), Dest(), "", options);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kUnavailable) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "HTTP 429")) << bytes.status();
  EXPECT_EQ(nginx_->Requests("/busy.tar", 2), 2);
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(5));  // slack for a loaded machine, far below the 10 s cap

  options.max_backoff = absl::Milliseconds(100);  // the cap wins over the server's 30 s
  const absl::Time capped_start = absl::Now();
  bytes = FetchUrlToFile(nginx_->Url("/very-busy.tar"), Dest(), "", options);
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kUnavailable) << bytes.status();
  EXPECT_EQ(nginx_->Requests("/very-busy.tar", 2), 2);
  EXPECT_LT(absl::Now() - capped_start, absl::Seconds(10));
}

TEST_F(NginxFetchTest, ContentLengthOverMaxBytes_ResourceExhaustedBeforeTheBody) {
  HttpFetchOptions options = FastOptions();
  options.max_bytes = 1 << 20;
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), "", options);
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kResourceExhausted) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "1048576")) << bytes.status();
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
}

TEST_F(NginxFetchTest, Redirect_FollowedToTheShard) {
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/moved.tar"), Dest(), DigestOf(big_), FastOptions());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kBigFileBytes);
  EXPECT_EQ(nginx_->Requests("/shard-000.tar", 1), 1);
}

TEST_F(NginxFetchTest, RedirectToAnotherScheme_InvalidArgument) {
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/to-ftp.tar"), Dest(), "", FastOptions());
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument) << bytes.status();
  EXPECT_FALSE(DestExists());
}

TEST_F(NginxFetchTest, BadArguments_InvalidArgumentNamingWhat) {
  absl::StatusOr<int64_t> r = FetchUrlToFile("ftp://127.0.0.1/a.tar", Dest(), "", FastOptions());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "ftp://127.0.0.1/a.tar")) << r.status();
  r = FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), "sha256:XYZ", FastOptions());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "sha256:XYZ")) << r.status();
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 0;
  r = FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), "", options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "max_attempts")) << r.status();
  r = FetchUrlToFile(nginx_->Url("/shard-000.tar"), dir_ + "/no-such-dir/a.tar", "", FastOptions());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no-such-dir")) << r.status();
  EXPECT_EQ(nginx_->Requests("/shard-000.tar", 0), 0);
}

TEST_F(NginxFetchTest, CancelledDuringBackoff_ReturnsCancelledPromptly) {
  HttpFetchOptions options = FastOptions();
  options.initial_backoff = absl::Seconds(20);
  options.max_backoff = absl::Seconds(20);
  std::atomic<bool> cancelled{false};
  absl::StatusOr<int64_t> bytes;
  std::thread fetch([&] {
    bytes = FetchUrlToFile(nginx_->Url("/unavailable.tar"), Dest(), "", options, &cancelled);
  });
  // Cancel once the first try has been answered, i.e. while the fetch waits to retry.
  EXPECT_EQ(nginx_->Requests("/unavailable.tar", 1), 1);
  const absl::Time cancel_time = absl::Now();
  cancelled = true;
  fetch.join();
  const absl::Duration took = absl::Now() - cancel_time;
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kCancelled) << bytes.status();
  EXPECT_LT(took, absl::Seconds(3));  // against the 20 s backoff
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
  std::printf("cancelled during backoff: returned %s after the flag\n",
              absl::FormatDuration(took).c_str());
}

// A presigned URL's query is its credential: no status message and no log line may show it.
TEST_F(NginxFetchTest, PresignedUrl_SecretInNoMessageAndNoLog) {
  FakeHttpServer stalled(FakeHttpServer::Mode::kNeverAnswer, "");
  FakeHttpServer torn(FakeHttpServer::Mode::kTruncate, "0123456789");
  const std::string query = "?X-Amz-Credential=AKIA%2Fsecret&X-Amz-Signature=secret";
  const std::vector<std::string> urls = {
      nginx_->Url("/shard-404.tar" + query),
      nginx_->Url("/forbidden.tar" + query),
      nginx_->Url("/unavailable.tar" + query),
      nginx_->Url("/to-ftp.tar" + query),
      stalled.Url("/stall.tar" + query),
      torn.Url("/torn.tar" + query),
      absl::StrCat("http://user:secret@127.0.0.1:", stalled.port(), "/a.tar", query),
  };
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 2;
  options.stall_timeout = absl::Milliseconds(300);  // two URLs stall
  ::testing::internal::CaptureStderr();
  std::vector<absl::Status> statuses;
  for (const std::string& url : urls) {
    statuses.push_back(FetchUrlToFile(url, Dest(), "", options).status());
  }
  statuses.push_back(
      FetchUrlToFile(nginx_->Url("/shard-000.tar" + query), Dest(), DigestOf("x"), options)
          .status());
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (const absl::Status& status : statuses) {
    EXPECT_FALSE(status.ok());
    EXPECT_FALSE(absl::StrContains(status.ToString(), "secret")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "?<redacted>")) << status;
  }
  EXPECT_FALSE(absl::StrContains(log, "secret")) << log;
  EXPECT_TRUE(absl::StrContains(log, "retrying")) << log;  // the retries did log
}

// nginx serving https with a certificate from a throwaway CA (deploy/tls/make-test-certs.sh).
class HttpsFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestTempPath("nginx");
    std::filesystem::remove_all(dir_);  // a fresh access log under --gtest_repeat too
    std::filesystem::create_directories(dir_ + "/www");
    std::filesystem::create_directories(dir_ + "/out");
    const dtrain::testing::CommandResult certs = dtrain::testing::RunShell(
        absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", dir_, "/tls"));
    ASSERT_EQ(certs.exit_code, 0) << certs.output;
    shard_ = RandomBytes(100000, 10);
    WriteFile(dir_ + "/www/shard-000.tar", shard_);
    std::string error;
    nginx_ = NginxServer::Start(dir_, "", dir_ + "/tls", &error);
    ASSERT_NE(nginx_, nullptr) << error;
  }
  std::string Dest() const { return dir_ + "/out/shard.tar"; }

  std::string dir_;
  std::string shard_;
  std::unique_ptr<NginxServer> nginx_;
};

TEST_F(HttpsFetchTest, CaFileTrustsTheServer_Fetched) {
  HttpFetchOptions options = FastOptions();
  options.ca_file = dir_ + "/tls/ca.pem";
  const std::string url = nginx_->Url("/shard-000.tar");
  ASSERT_TRUE(absl::StartsWith(url, "https://")) << url;
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(url, Dest(), DigestOf(shard_), options);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, static_cast<int64_t>(shard_.size()));
  EXPECT_TRUE(ReadFile(Dest()) == shard_);
}

// Both failure cases in one test: each HttpsFetchTest makes its own CA and keys (~1 s).
TEST_F(HttpsFetchTest, UntrustedOrMissingCa_RefusedWithoutRetry) {
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), "", FastOptions());
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kFailedPrecondition) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "ca_file")) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(1 try)")) << bytes.status();
  EXPECT_FALSE(std::filesystem::exists(Dest()));
  std::printf("%s\n", bytes.status().ToString().c_str());

  HttpFetchOptions options = FastOptions();
  options.ca_file = dir_ + "/tls/no-such-ca.pem";
  bytes = FetchUrlToFile(nginx_->Url("/shard-000.tar"), Dest(), "", options);
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "no-such-ca.pem")) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(1 try)")) << bytes.status();
  std::printf("%s\n", bytes.status().ToString().c_str());
}

}  // namespace http_shard_fetcher_test
}  // namespace dtrain

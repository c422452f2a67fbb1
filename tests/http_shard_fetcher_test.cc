// FetchUrlToFile against a real nginx (Debian's, started per test on 127.0.0.1 and always reaped)
// for what a web server answers, and against a small in-test TCP server for what a broken one
// does: never answer, close before Content-Length, fail twice then serve. Timeouts and backoffs
// are milliseconds so the whole suite runs in a few seconds.
#include "worker/data/http_shard_fetcher.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <signal.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace dtrain {
namespace http_shard_fetcher_test {

using ::dtrain::testing::PickFreePort;
using ::dtrain::testing::ReadFile;
using ::dtrain::testing::Subprocess;
using ::dtrain::testing::TestTempPath;
using ::dtrain::testing::WaitFor;

constexpr char kNginx[] = "/usr/sbin/nginx";
constexpr int64_t kBigFileBytes = int64_t{5} << 20;

// Options that keep each failure test short. The stall timeout is long: a server
// (or this process) held up for a moment on a loaded CI machine must not make a spurious retry
// that the exact request counts would see; the stall tests set their own.
HttpFetchOptions FastOptions() {
  HttpFetchOptions o;
  o.connect_timeout = absl::Seconds(2);
  o.stall_timeout = absl::Seconds(10);
  o.max_attempts = 3;
  o.initial_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(40);
  return o;
}

std::string RandomBytes(int64_t size, uint32_t seed) {
  std::mt19937 generator(seed);
  std::string bytes(static_cast<size_t>(size), '\0');
  for (char& c : bytes) c = static_cast<char>(generator() & 0xff);
  return bytes;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

std::string DigestOf(const std::string& bytes) {
  Sha256 hasher;
  hasher.Update(bytes);
  return hasher.Finish();
}

// Files of `directory` whose name contains `part` (left-over spool files).
int FilesContaining(const std::string& directory, const std::string& part) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (absl::StrContains(entry.path().filename().string(), part)) ++n;
  }
  return n;
}

// Debian's nginx in the foreground, one process (master_process off: nothing to orphan, and no
// switch to another user, so it reads the test's files), everything under its own directory.
class NginxServer {
 public:
  // Serves <dir>/www; extra_locations go inside the server block. With a tls_dir (made by
  // deploy/tls/make-test-certs.sh) it serves https with tls_dir/server.pem.
  static std::unique_ptr<NginxServer> Start(const std::string& dir,
                                            const std::string& extra_locations,
                                            const std::string& tls_dir, std::string* error) {
    if (access(kNginx, X_OK) != 0) {
      *error = absl::StrCat(kNginx,
                            " is missing: this test needs Debian's nginx "
                            "(deploy/install-deps.sh --test installs it)");
      return nullptr;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto server = std::unique_ptr<NginxServer>(new NginxServer(dir));
      server->port_ = PickFreePort();
      server->scheme_ = tls_dir.empty() ? "http" : "https";
      const std::string tls =
          tls_dir.empty()
              ? ";\n"
              : absl::StrCat(" ssl;\n    ssl_certificate ", tls_dir,
                             "/server.pem;\n    ssl_certificate_key ", tls_dir, "/server.key;\n");
      const std::string config = absl::StrCat(
          "daemon off;\nmaster_process off;\npid ", dir, "/nginx.pid;\nerror_log ", dir,
          "/error.log info;\nevents { worker_connections 64; }\nhttp {\n  access_log ", dir,
          "/access.log;\n  client_body_temp_path ", dir, "/client_body;\n  proxy_temp_path ", dir,
          "/proxy;\n  fastcgi_temp_path ", dir, "/fastcgi;\n  uwsgi_temp_path ", dir,
          "/uwsgi;\n  scgi_temp_path ", dir,
          "/scgi;\n  server {\n    listen 127.0.0.1:", server->port_, tls, "    root ", dir,
          "/www;\n", extra_locations, "  }\n}\n");
      unlink((dir + "/nginx.pid").c_str());
      WriteFile(dir + "/nginx.conf", config);
      server->process_ = Subprocess::Start(
          {kNginx, "-p", dir, "-c", dir + "/nginx.conf", "-e", dir + "/error.log"});
      if (server->process_ == nullptr) {
        *error = absl::StrCat("cannot start ", kNginx);
        return nullptr;
      }
      // nginx writes its pid file once its socket listens; it exits when the bind fails.
      const std::string pid = absl::StrCat(server->process_->pid());
      const std::string pid_file = dir + "/nginx.pid";
      bool exited = false;
      const bool ready = WaitFor(
          [&] {
            if (server->process_->Wait(absl::Milliseconds(1)) != -1) exited = true;
            return exited || absl::StripAsciiWhitespace(ReadFile(pid_file)) == pid;
          },
          absl::Seconds(10));
      if (ready && !exited) return server;
      *error = absl::StrCat("nginx did not start on port ", server->port_, "; its error log:\n",
                            ReadFile(dir + "/error.log"));
      if (!exited) return nullptr;  // hung: no point retrying another port
    }
    return nullptr;
  }

  ~NginxServer() {
    if (process_ != nullptr) {
      process_->Kill(SIGTERM);
      if (process_->Wait(absl::Seconds(5)) == -1) process_->Kill(SIGKILL);
    }  // ~Subprocess reaps it in any case
  }

  std::string Url(const std::string& path) const {
    return absl::StrCat(scheme_, "://127.0.0.1:", port_, path);
  }
  // How many requests for `path` nginx logged (it logs after answering, so wait a little).
  int Requests(const std::string& path, int at_least) const {
    const auto count = [&] {
      int n = 0;
      for (absl::string_view line : absl::StrSplit(ReadFile(dir_ + "/access.log"), '\n')) {
        if (absl::StrContains(line, absl::StrCat("\"GET ", path, " "))) ++n;
      }
      return n;
    };
    WaitFor([&] { return count() >= at_least; }, absl::Seconds(2));
    return count();
  }

 private:
  explicit NginxServer(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::string scheme_;
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

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

// A TCP server on 127.0.0.1:0 that speaks just enough HTTP/1.1 to misbehave in one way.
class FakeHttpServer {
 public:
  enum class Mode {
    kNeverAnswer,         // reads the request, then holds the connection open, silent
    kTruncate,            // Content-Length: 2x the body, sends the body, closes
    kFailTwiceThenServe,  // 503 to the first two connections, then 200 with the body
    kStallMidBody,        // Content-Length: 2x the body, sends the body, then holds on, silent
  };

  FakeHttpServer(Mode mode, std::string body) : mode_(mode), body_(std::move(body)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        listen(listen_fd_, 16) == 0 &&
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }

  int port() const { return port_; }
  std::string Url(const std::string& path_and_query) const {
    return absl::StrCat("http://127.0.0.1:", port_, path_and_query);
  }
  int connections() const {
    absl::MutexLock lock(&mu_);
    return connections_;
  }
  // Whether `n` connections arrived (and sent their request) within `timeout`.
  bool WaitForConnections(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    const auto arrived = [this, n]()
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connections_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  }

 private:
  void Serve() {
    std::vector<int> held;
    while (!stop_) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      if (poll(&pfd, 1, 20) <= 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ReadRequest(fd);
      int number;
      {
        absl::MutexLock lock(&mu_);
        number = ++connections_;
      }
      switch (mode_) {
        case Mode::kNeverAnswer:
          held.push_back(fd);
          continue;
        case Mode::kStallMidBody:
          Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", 2 * body_.size(), "\r\n\r\n",
                                body_));
          held.push_back(fd);
          continue;
        case Mode::kTruncate:
          Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", 2 * body_.size(),
                                "\r\nConnection: close\r\n\r\n", body_));
          break;
        case Mode::kFailTwiceThenServe:
          if (number <= 2) {
            Send(fd,
                 "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                 "Connection: close\r\n\r\n");
          } else {
            Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", body_.size(),
                                  "\r\nConnection: close\r\n\r\n", body_));
          }
          break;
      }
      close(fd);
    }
    for (int fd : held) close(fd);
  }

  // Up to the blank line that ends the request's headers (a GET has no body), or 2 s.
  static void ReadRequest(int fd) {
    std::string request;
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (!absl::StrContains(request, "\r\n\r\n") && absl::Now() < deadline) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 50) <= 0) continue;
      char buffer[4096];
      const ssize_t n = read(fd, buffer, sizeof buffer);
      if (n <= 0) return;
      request.append(buffer, static_cast<size_t>(n));
    }
  }

  static void Send(int fd, const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  const Mode mode_;
  const std::string body_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

class FakeServerFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestTempPath("out");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string Dest() const { return dir_ + "/shard.tar"; }
  bool DestExists() const { return std::filesystem::exists(Dest()); }
  int SpoolFiles() const { return FilesContaining(dir_, ".part-"); }
  std::string dir_;
};

TEST_F(FakeServerFetchTest, ServerNeverAnswers_DeadlineExceededAfterEachTryStalls) {
  FakeHttpServer server(FakeHttpServer::Mode::kNeverAnswer, "");
  ASSERT_NE(server.port(), 0);
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 2;
  options.stall_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(server.Url("/stall.tar"), Dest(), "", options);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kDeadlineExceeded) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "stall_timeout")) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(2 tries)")) << bytes.status();
  EXPECT_EQ(server.connections(), 2);
  EXPECT_GE(took, 2 * options.stall_timeout);
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
  std::printf("two stalled tries of 300 ms each: %s\n", absl::FormatDuration(took).c_str());
}

TEST_F(FakeServerFetchTest, SilentAfterPartOfTheBody_DeadlineExceededNamingBytes) {
  FakeHttpServer server(FakeHttpServer::Mode::kStallMidBody, RandomBytes(1000, 9));
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 1;
  options.stall_timeout = absl::Milliseconds(300);
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(server.Url("/half.tar"), Dest(), "", options);
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kDeadlineExceeded) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "after 1000 body bytes"))
      << bytes.status();
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
}

TEST_F(FakeServerFetchTest, AttemptTimeout_DeadlineExceeded) {
  FakeHttpServer server(FakeHttpServer::Mode::kNeverAnswer, "");
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 1;
  options.stall_timeout = absl::Seconds(30);
  options.attempt_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(server.Url("/slow.tar"), Dest(), "", options);
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kDeadlineExceeded) << bytes.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(DestExists());
}

TEST_F(FakeServerFetchTest, BodyShorterThanContentLength_RetriedThenDataLoss) {
  FakeHttpServer server(FakeHttpServer::Mode::kTruncate, RandomBytes(1000, 7));
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(server.Url("/torn.tar"), Dest(), "", FastOptions());
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kDataLoss) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "truncated after 1000 bytes"))
      << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(3 tries)")) << bytes.status();
  EXPECT_EQ(server.connections(), 3);
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
}

TEST_F(FakeServerFetchTest, TwoFailuresThenSuccess_FetchedOnTheThirdTry) {
  const std::string body = RandomBytes(100000, 8);
  FakeHttpServer server(FakeHttpServer::Mode::kFailTwiceThenServe, body);
  absl::StatusOr<int64_t> bytes =
      FetchUrlToFile(server.Url("/flaky.tar"), Dest(), DigestOf(body), FastOptions());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, static_cast<int64_t>(body.size()));
  EXPECT_TRUE(ReadFile(Dest()) == body);
  EXPECT_EQ(server.connections(), 3);
  EXPECT_EQ(SpoolFiles(), 0);
}

TEST_F(FakeServerFetchTest, CancelledWhileStalled_CancelledWithin1s) {
  FakeHttpServer server(FakeHttpServer::Mode::kNeverAnswer, "");
  HttpFetchOptions options = FastOptions();
  options.stall_timeout = absl::Seconds(30);
  std::atomic<bool> cancelled{false};
  absl::StatusOr<int64_t> bytes;
  std::thread fetch(
      [&] { bytes = FetchUrlToFile(server.Url("/stall.tar"), Dest(), "", options, &cancelled); });
  EXPECT_TRUE(server.WaitForConnections(1, absl::Seconds(5)));
  // Well into the quiet wait, where curl itself would call back only about once a second.
  absl::SleepFor(absl::Milliseconds(325));
  const absl::Time cancel_time = absl::Now();
  cancelled = true;
  fetch.join();
  const absl::Duration took = absl::Now() - cancel_time;
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kCancelled) << bytes.status();
  EXPECT_LT(took, absl::Seconds(1));
  EXPECT_EQ(server.connections(), 1);
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
  std::printf("cancelled while stalled: returned %s after the flag\n",
              absl::FormatDuration(took).c_str());
}

TEST_F(FakeServerFetchTest, ConnectionRefused_RetriedThenUnavailable) {
  // A socket bound but not listening: connections to its port are refused while we hold it.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string url = absl::StrCat("http://127.0.0.1:", ntohs(address.sin_port), "/a.tar");
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(url, Dest(), "", FastOptions());
  close(fd);
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kUnavailable) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), url)) << bytes.status();
  EXPECT_TRUE(absl::StrContains(bytes.status().message(), "(3 tries)")) << bytes.status();
  EXPECT_FALSE(DestExists());
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

}  // namespace http_shard_fetcher_test
}  // namespace dtrain

// FetchUrlToFile against a small in-test TCP server (FakeHttpServer) for what a broken web server
// does: never answer, go silent mid-body, close before Content-Length, fail twice then serve;
// and against a port that refuses connections. And a shard list's own bound on its download.
// Timeouts and backoffs are milliseconds so the whole suite runs in a few seconds.
#include "worker/data/http_shard_fetcher.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/http_shard_fetcher_fixture.h"
#include "tests/test_support.h"
#include "worker/data/shard_catalog.h"

namespace dtrain {
namespace http_shard_fetcher_broken_server_test {

using ::dtrain::testing::ReadFile;
using ::dtrain::testing::TestTempPath;

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
  // Through the function a stream calls: the torn tries' bytes count too, as a download's signs
  // of life (sharded_split.h's stuck_after).
  std::atomic<int64_t> received{0};
  const absl::Status through = UrlFetcher(FastOptions())(server.Url("/torn.tar"), Dest(), "",
                                                         nullptr, absl::ZeroDuration(), &received);
  EXPECT_EQ(through.code(), absl::StatusCode::kDataLoss) << through;
  EXPECT_EQ(received.load(), 3 * 1000);
  EXPECT_FALSE(DestExists());
  EXPECT_EQ(SpoolFiles(), 0);
}

TEST_F(FakeServerFetchTest, TwoFailuresThenSuccess_FetchedOnTheThirdTry) {
  const std::string body = RandomBytes(100000, 8);
  FakeHttpServer server(FakeHttpServer::Mode::kFailTwiceThenServe, body);
  std::atomic<int64_t> received{0};  // what a stream judges a long download's progress by
  absl::StatusOr<int64_t> bytes = FetchUrlToFile(server.Url("/flaky.tar"), Dest(), DigestOf(body),
                                                 FastOptions(), nullptr, &received);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, static_cast<int64_t>(body.size()));
  EXPECT_EQ(received.load(), static_cast<int64_t>(body.size()));
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

// A shard list is small, so its download has a bound of its own (a shard's has none: 64 GiB
// may take long): a server that never sends the list fails it at that bound, naming the field
// and the list, where the stall timeout alone would wait 30 s; and the job's cancellation ends
// the list's download too. Nothing is left in the spool directory.
TEST_F(FakeServerFetchTest, ShardListNeverSent_FailsAtTheListBound_OrWhenTheJobIsCancelled) {
  FakeHttpServer server(FakeHttpServer::Mode::kNeverAnswer, "");
  HttpFetchOptions options = FastOptions();
  options.max_attempts = 1;
  options.stall_timeout = absl::Seconds(30);
  ShardFetcher fetcher;
  fetcher.url = UrlFetcher(options);
  fetcher.spool_dir = dir_;
  fetcher.list_attempt_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<ShardCatalog> bounded =
      ResolveShards(server.Url("/list.txt"), "spec.data.shards.train", fetcher);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(bounded.status().code(), absl::StatusCode::kDeadlineExceeded) << bounded.status();
  EXPECT_TRUE(absl::StrContains(bounded.status().message(), "spec.data.shards.train: shard list"))
      << bounded.status();
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(5));

  fetcher.list_attempt_timeout = absl::Minutes(2);
  std::atomic<bool> cancelled{false};
  absl::StatusOr<ShardCatalog> stopped;
  std::thread resolve([&] {
    stopped = ResolveShards(server.Url("/list.txt"), "spec.data.shards.train", fetcher, &cancelled);
  });
  EXPECT_TRUE(server.WaitForConnections(2, absl::Seconds(5)));
  const absl::Time cancel_time = absl::Now();
  cancelled = true;
  resolve.join();
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  EXPECT_LT(absl::Now() - cancel_time, absl::Seconds(1));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            0);
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

}  // namespace http_shard_fetcher_broken_server_test
}  // namespace dtrain

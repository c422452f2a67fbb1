// The Jobs service read by a client with gRPC's default settings (4 MiB per received message),
// as users' generated clients in any language are: a job list, a job log of over 64 MiB and a
// metric history of over 4 MiB each come back whole, in pages, never as RESOURCE_EXHAUSTED.
// (The collectives' side of this is in collectives_test.) The history is made directly in the
// coordinator's database and state directory, then a coordinator starts on them.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_store.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace default_limits_test {

using ::testing::HasSubstr;

constexpr int kJobs = 2500;        // x ~2 KiB of status each: ~5 MiB of list
constexpr int kLogLines = 700000;  // x ~100 bytes: ~70 MiB of log
constexpr int kPoints = 160000;    // x ~30 bytes: ~5 MiB of metric points

TEST(DefaultLimits, JobsService_ListLogsAndMetricsOver4And64MiB_InPages) {
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/default-limits-", getpid()));
  const std::string state = cluster.dir() + "/state";
  std::filesystem::create_directories(state + "/jobs/big-1");
  {
    auto store = JobStore::Open(state + "/coordinator.db");
    ASSERT_TRUE(store.ok()) << store.status();
    for (int j = 1; j <= kJobs; ++j) {
      v1::JobSpec spec;
      spec.set_name(j == 1 ? "big" : "other");
      v1::JobStatus status;
      status.set_id(j == 1 ? "big-1" : absl::StrCat("other-", j));
      status.set_state(v1::FAILED);
      status.set_reason(std::string(2000, 'r'));
      ASSERT_TRUE((*store)->Insert(spec, status).ok());
    }
    for (int i = 0; i < kPoints; ++i) {
      v1::MetricPoint p;
      p.set_name("train_loss");
      p.set_value(1.0 / (i + 1));
      p.set_step(i);
      ASSERT_TRUE((*store)->AddMetric("big-1", p).ok());
    }
  }
  {
    std::ofstream log(state + "/jobs/big-1/job.log");
    const std::string padding(80, 'x');
    for (int i = 0; i < kLogLines; ++i) log << "line " << i << " " << padding << "\n";
  }
  ASSERT_TRUE(cluster.StartCoordinator());

  auto jobs =
      v1::Jobs::NewStub(grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()));
  auto call = [](auto rpc) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return rpc(&context);
  };

  // The list.
  int listed = 0, pages = 0;
  v1::ListJobsRequest list;
  do {
    v1::ListJobsResponse page;
    grpc::Status s = call([&](auto* c) { return jobs->ListJobs(c, list, &page); });
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
    listed += page.jobs_size();
    ++pages;
    list.set_page_token(page.next_page_token());
  } while (!list.page_token().empty());
  EXPECT_EQ(listed, kJobs);
  EXPECT_GE(pages, 2);
  v1::ListJobsRequest small;
  small.set_page_size(7);
  v1::ListJobsResponse seven;
  ASSERT_TRUE(call([&](auto* c) { return jobs->ListJobs(c, small, &seven); }).ok());
  EXPECT_EQ(seven.jobs_size(), 7);
  EXPECT_EQ(seven.next_page_token(), "7");
  // From the newest back: the last job submitted first, and a token that keeps that order.
  v1::ListJobsRequest newest;
  newest.set_page_size(3);
  newest.set_newest_first(true);
  v1::ListJobsResponse three, next;
  ASSERT_TRUE(call([&](auto* c) { return jobs->ListJobs(c, newest, &three); }).ok());
  ASSERT_EQ(three.jobs_size(), 3);
  EXPECT_EQ(three.jobs(0).id(), absl::StrCat("other-", kJobs));
  EXPECT_EQ(three.jobs(2).id(), absl::StrCat("other-", kJobs - 2));
  EXPECT_EQ(three.total_size(), kJobs);
  newest.set_page_token(three.next_page_token());
  ASSERT_TRUE(call([&](auto* c) { return jobs->ListJobs(c, newest, &next); }).ok());
  ASSERT_EQ(next.jobs_size(), 3);
  EXPECT_EQ(next.jobs(0).id(), absl::StrCat("other-", kJobs - 3));
  // The CLI shows the newest page by default, newest last, and says what it left out.
  CommandResult listed_cli = cluster.Dtrain("list --limit 5");
  ASSERT_EQ(listed_cli.exit_code, 0) << listed_cli.output;
  EXPECT_THAT(listed_cli.output, HasSubstr(absl::StrCat("(the newest 5 of ", kJobs, " jobs")));
  EXPECT_LT(listed_cli.output.find(absl::StrCat("other-", kJobs - 1, " ")),
            listed_cli.output.find(absl::StrCat("other-", kJobs, " ")));
  EXPECT_EQ(listed_cli.output.find(absl::StrCat("other-", kJobs - 5, " ")), std::string::npos);
  CommandResult all_cli = cluster.Dtrain("list --limit 0");
  ASSERT_EQ(all_cli.exit_code, 0);
  EXPECT_NE(all_cli.output.find("big-1 "), std::string::npos);
  EXPECT_EQ(all_cli.output.find("(the newest"), std::string::npos);
  small.set_page_token("not-a-token");
  grpc::Status bad = call([&](auto* c) { return jobs->ListJobs(c, small, &seven); });
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The log.
  int64_t lines = 0, log_pages = 0;
  v1::GetJobLogsRequest logs;
  logs.set_id("big-1");
  while (true) {
    v1::GetJobLogsResponse page;
    grpc::Status s = call([&](auto* c) { return jobs->GetJobLogs(c, logs, &page); });
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
    ASSERT_GT(page.lines_size(), 0);
    EXPECT_EQ(page.lines(0).rfind(absl::StrCat("line ", lines, " "), 0), 0u) << "in order";
    lines += page.lines_size();
    ++log_pages;
    logs.set_from_line(page.next_line());
    if (!page.truncated()) break;
  }
  EXPECT_EQ(lines, kLogLines);
  EXPECT_GE(log_pages, 17) << "70 MiB in pages of at most 4 MiB";

  // The metric history.
  int64_t points = 0;
  int metric_pages = 0;
  v1::GetJobMetricsRequest metrics;
  metrics.set_id("big-1");
  while (true) {
    v1::GetJobMetricsResponse page;
    grpc::Status s = call([&](auto* c) { return jobs->GetJobMetrics(c, metrics, &page); });
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
    if (page.points_size() > 0) {
      EXPECT_EQ(page.points(0).step(), points) << "in order";
    }
    points += page.points_size();
    ++metric_pages;
    metrics.set_from_point(page.next_point());
    if (!page.truncated()) break;
  }
  EXPECT_EQ(points, kPoints);
  EXPECT_GE(metric_pages, 2);
}

}  // namespace default_limits_test
}  // namespace dtrain::testing

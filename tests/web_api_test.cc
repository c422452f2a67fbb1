// The coordinator's HTTP JSON API (/api/v1/) against a real local cluster, read with an HTTP
// client as curl would: each route's status codes and bodies, parsed back into the protobuf
// messages the gRPC services answer (proto3 JSON mapping); the job list's pages, sort keys and
// state filter; incremental reads (since, offset) and their caps per answer; the live stream;
// downloads; cancel. Who may read it: web_api_auth_test.cc; hostile sites and clients:
// web_api_attacks_test.cc.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/sha256.h"
#include "coordinator/jobs/job_store.h"
#include "dtrain/v1/cluster.pb.h"
#include "dtrain/v1/coordinator.pb.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/workers.pb.h"
#include "tests/local_cluster.h"
#include "tests/web_api_fixture.h"

namespace dtrain::testing {
namespace web_api_test {

using ::testing::HasSubstr;

TEST_F(WebApiTest, Routes_StatusCodesAndProtoJson_IncrementalReads_StreamDownloadCancel) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(cluster_->AddWorker("w0"));
  ASSERT_TRUE(cluster_->AddWorker("w1"));
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers(true) == 2; }, absl::Seconds(10)));

  auto empty = http_->Get("/api/v1/jobs");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 200);
  EXPECT_EQ(empty->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(Parse<v1::ListJobsResponse>(empty->body).total_size(), 0);

  const std::string id = cluster_->Submit("web", SyntheticDdpJob("web", 2, 1024));
  ASSERT_FALSE(id.empty());
  // The live stream sees it run and end (read until the terminal event or 60 s).
  std::string stream;
  httplib::Client sse("127.0.0.1", port_);
  sse.set_read_timeout(60, 0);
  auto streamed = sse.Get(absl::StrCat("/api/v1/events?job=", id), [&](const char* data, size_t n) {
    stream.append(data, n);
    return !absl::StrContains(stream, "\"state\":\"SUCCEEDED\"") &&
           !absl::StrContains(stream, "\"state\":\"FAILED\"");
  });
  EXPECT_THAT(stream, HasSubstr("event: job\ndata: {"));
  EXPECT_THAT(stream, HasSubstr("\"state\":\"RUNNING\""));
  EXPECT_THAT(stream, HasSubstr("\"state\":\"SUCCEEDED\""));
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->GetJob(id).state() == v1::SUCCEEDED; }, absl::Seconds(60)));

  // Jobs, paged and sorted; one job with its spec.
  auto list = http_->Get("/api/v1/jobs?page_size=1&sort=name&order=asc");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->status, 200) << list->body;
  const v1::ListJobsResponse page = Parse<v1::ListJobsResponse>(list->body);
  ASSERT_EQ(page.jobs_size(), 1);
  EXPECT_EQ(page.jobs(0).id(), id);
  EXPECT_EQ(page.total_size(), 1);
  EXPECT_TRUE(page.next_page_token().empty());
  auto one = http_->Get("/api/v1/jobs/" + id);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  const v1::JobStatus job = Parse<v1::JobStatus>(one->body);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.spec().trainer().num_nodes(), 2) << "GetJob's spec comes along";
  EXPECT_THAT(one->body, HasSubstr("\"globalStep\":\"32\"")) << "proto3 JSON: int64 as a string";

  // Metric points from `since`, then nothing new.
  auto metrics = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?since=0"));
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  const v1::GetJobMetricsResponse points = Parse<v1::GetJobMetricsResponse>(metrics->body);
  ASSERT_GT(points.points_size(), 4);
  EXPECT_EQ(points.next_point(), points.points_size());
  std::set<std::string> names;
  for (const v1::MetricPoint& p : points.points()) names.insert(p.name());
  EXPECT_TRUE(names.count("train_loss") && names.count("val_loss") && names.count("test_acc"));
  auto later =
      http_->Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?since=", points.next_point() - 1));
  ASSERT_TRUE(later);
  EXPECT_EQ(Parse<v1::GetJobMetricsResponse>(later->body).points_size(), 1);
  for (const char* bad : {"abc", "-1", "1.5"}) {
    auto refused = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?since=", bad));
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << bad;
    EXPECT_EQ(ErrorCode(refused->body), "INVALID_ARGUMENT");
    EXPECT_THAT(refused->body, HasSubstr("'since' must be a whole number"));
  }

  // The log from an offset.
  auto logs = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/logs?offset=0"));
  ASSERT_TRUE(logs);
  const v1::GetJobLogsResponse all_lines = Parse<v1::GetJobLogsResponse>(logs->body);
  ASSERT_GT(all_lines.lines_size(), 3);
  EXPECT_THAT(all_lines.lines(0), HasSubstr("submitted"));
  auto tail =
      http_->Get(absl::StrCat("/api/v1/jobs/", id, "/logs?offset=", all_lines.next_line() - 1));
  ASSERT_TRUE(tail);
  const v1::GetJobLogsResponse last_line = Parse<v1::GetJobLogsResponse>(tail->body);
  ASSERT_EQ(last_line.lines_size(), 1);
  EXPECT_THAT(last_line.lines(0), HasSubstr("job SUCCEEDED"));

  // Workers, groups, the cluster.
  auto workers = http_->Get("/api/v1/workers");
  ASSERT_TRUE(workers);
  EXPECT_EQ(Parse<v1::ListWorkersResponse>(workers->body).workers_size(), 2);
  auto groups = http_->Get("/api/v1/groups");
  ASSERT_TRUE(groups);
  EXPECT_EQ(groups->status, 200);
  Parse<v1::ListGroupsResponse>(groups->body);
  auto cluster = http_->Get("/api/v1/cluster");
  ASSERT_TRUE(cluster);
  const v1::ClusterSummary summary = Parse<v1::ClusterSummary>(cluster->body);
  EXPECT_EQ(summary.workers_size(), 2);
  EXPECT_EQ(summary.jobs_by_state().at("SUCCEEDED"), 1);

  // The last checkpoint, as the store keeps it.
  ASSERT_FALSE(job.files().empty());
  const v1::JobFile& file = job.files(0);
  auto download = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/files/", file.name()));
  ASSERT_TRUE(download);
  ASSERT_EQ(download->status, 200);
  EXPECT_EQ(static_cast<int64_t>(download->body.size()), file.size_bytes());
  Sha256 hash;
  hash.Update(download->body);
  EXPECT_EQ(hash.Finish(), file.digest());
  EXPECT_THAT(download->get_header_value("Content-Disposition"), HasSubstr(file.name()));

  // Errors: unknown job, file and route; cancelling an ended job; a cross-site POST.
  for (const std::string& path : std::vector<std::string>{
           "/api/v1/jobs/nosuch-1", "/api/v1/jobs/nosuch-1/metrics", "/api/v1/jobs/nosuch-1/logs",
           "/api/v1/nothing-here", "/api/v1/jobs/" + id + "/files/nosuch.ckpt"}) {
    auto missing = http_->Get(path);
    ASSERT_TRUE(missing) << path;
    EXPECT_EQ(missing->status, 404) << path;
    EXPECT_EQ(ErrorCode(missing->body), "NOT_FOUND") << path;
  }
  auto ended = http_->Post(absl::StrCat("/api/v1/jobs/", id, "/cancel"));
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->status, 409);
  EXPECT_EQ(ErrorCode(ended->body), "FAILED_PRECONDITION");
  httplib::Headers foreign = {{"Origin", "http://evil.example"}};
  auto forged =
      http_->Post(absl::StrCat("/api/v1/jobs/", id, "/cancel"), foreign, "", "text/plain");
  ASSERT_TRUE(forged);
  EXPECT_EQ(forged->status, 403);
  EXPECT_EQ(ErrorCode(forged->body), "PERMISSION_DENIED");
  auto bad_sort = http_->Get("/api/v1/jobs?sort=color");
  ASSERT_TRUE(bad_sort);
  EXPECT_EQ(bad_sort->status, 400);

  // A running job is cancelled by POST.
  const std::string long_id = cluster_->Submit("long", SyntheticDdpJob("long", 1000, 4096));
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->GetJob(long_id).state() == v1::RUNNING; }, absl::Seconds(30)));
  httplib::Headers same = {{"Origin", absl::StrCat("http://127.0.0.1:", port_)}};
  auto cancel =
      http_->Post(absl::StrCat("/api/v1/jobs/", long_id, "/cancel"), same, "", "text/plain");
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 200) << cancel->body;
  ASSERT_TRUE(WaitFor([&] { return cluster_->GetJob(long_id).state() == v1::CANCELLED; },
                      absl::Seconds(15)));

  // The page and its files.
  auto index = http_->Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_THAT(index->body, HasSubstr("/static/app.js"));
  auto chart = http_->Get("/static/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_THAT(chart->body, HasSubstr("Chart.js v3")) << "Debian's libjs-chart.js, embedded";
}

// A thousand jobs in the history: every list is a page, the summary counts them all, and the
// stream starts with what runs only. (Times are printed, not asserted: bench/ measures.)
TEST_F(WebApiTest, AThousandJobs_PagedNeverWhole) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_name("bulk");
  submit.mutable_spec()->mutable_model()->set_builtin("mlp");
  submit.mutable_spec()->mutable_data()->mutable_synthetic()->set_train_size(64);
  for (int i = 0; i < 1000; ++i) {
    grpc::ClientContext context;
    v1::SubmitJobResponse response;
    ASSERT_TRUE(cluster_->jobs().SubmitJob(&context, submit, &response).ok()) << i;
  }
  const absl::Time start = absl::Now();
  auto first = http_->Get("/api/v1/jobs");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(first);
  const v1::ListJobsResponse page = Parse<v1::ListJobsResponse>(first->body);
  EXPECT_EQ(page.jobs_size(), 50);
  EXPECT_EQ(page.total_size(), 1000);
  EXPECT_EQ(page.next_page_token(), "50");
  EXPECT_EQ(page.jobs(0).id(), "bulk-1000") << "newest first";
  auto last = http_->Get("/api/v1/jobs?page_size=500&page_token=500&order=asc");
  ASSERT_TRUE(last);
  const v1::ListJobsResponse tail = Parse<v1::ListJobsResponse>(last->body);
  EXPECT_EQ(tail.jobs_size(), 500);
  EXPECT_EQ(tail.jobs(499).id(), "bulk-1000");
  EXPECT_TRUE(tail.next_page_token().empty());
  auto beyond = http_->Get("/api/v1/jobs?page_token=9223372036854775807");
  ASSERT_TRUE(beyond);
  EXPECT_EQ(beyond->status, 200);
  EXPECT_EQ(Parse<v1::ListJobsResponse>(beyond->body).jobs_size(), 0) << "past the end: empty";
  auto capped = http_->Get("/api/v1/jobs?page_size=100000");
  ASSERT_TRUE(capped);
  EXPECT_EQ(Parse<v1::ListJobsResponse>(capped->body).jobs_size(), 500) << "at most 500 a page";
  auto summary = http_->Get("/api/v1/cluster");
  ASSERT_TRUE(summary);
  EXPECT_EQ(Parse<v1::ClusterSummary>(summary->body).jobs_by_state().at("QUEUED"), 1000);
  std::printf("GET /api/v1/jobs with 1000 jobs: %.1f ms, %zu bytes\n",
              absl::ToDoubleMilliseconds(took), first->body.size());
}

// What docs/dashboard.md promises of the job list, on jobs a coordinator ran before (written to
// its state as it would have, then restored): every sort key in both directions, each key's
// values distinct so each order is the one only that key gives, and the state= filter.
struct SeededJob {
  std::string id, name;
  v1::JobState state;
  int64_t step;
  double samples_per_second;
};
const std::vector<SeededJob>& SeededJobs() {
  // In submission order. Orders ascending: name 3 5 1 2 4, id 3 5 2 1 4 ("run-2-1" < "run-3"),
  // state 3 2 {4 5} 1, step 4 1 3 2 5, samples/s 3 1 5 4 2.
  static const std::vector<SeededJob> jobs = {
      {"run-3", "run", v1::CANCELLED, 20, 2.5},  {"run-2-1", "run-2", v1::SUCCEEDED, 40, 7.5},
      {"eval-1", "eval", v1::QUEUED, 30, 1.0},   {"sweep-1", "sweep", v1::FAILED, 10, 5.0},
      {"probe-1", "probe", v1::FAILED, 50, 3.5},
  };
  return jobs;
}

// The seeded jobs into <state_dir>/coordinator.db; the SUCCEEDED one with `points` metric
// points and a job.log of `lines` lines.
void SeedJobs(const std::string& state_dir, int points, int lines) {
  std::filesystem::create_directories(state_dir);
  auto store = JobStore::Open(state_dir + "/coordinator.db");
  ASSERT_TRUE(store.ok()) << store.status();
  int64_t submitted = 1767225600000;  // 2026-01-01
  for (const SeededJob& j : SeededJobs()) {
    v1::JobSpec spec;
    spec.set_name(j.name);
    spec.mutable_model()->set_builtin("mlp");
    spec.mutable_data()->mutable_synthetic()->set_train_size(64);
    v1::JobStatus status;
    status.set_id(j.id);
    status.set_name(j.name);
    status.set_state(j.state);
    status.set_submitted_unix_ms(submitted += 1000);
    if (IsTerminal(j.state)) status.set_finished_unix_ms(submitted + 500);
    status.mutable_progress()->set_global_step(j.step);
    status.mutable_progress()->set_samples_per_second(j.samples_per_second);
    ASSERT_TRUE((*store)->Insert(spec, status).ok());
    if (j.state != v1::SUCCEEDED) continue;
    for (int i = 0; i < points; ++i) {
      v1::MetricPoint point;
      point.set_name("train_loss");
      point.set_step(i);
      point.set_value(1.0 / (i + 1));
      ASSERT_TRUE((*store)->AddMetric(j.id, point).ok());
    }
    const std::string dir = absl::StrCat(state_dir, "/jobs/", j.id);
    std::filesystem::create_directories(dir);
    std::ofstream log(dir + "/job.log");
    for (int i = 0; i < lines; ++i) log << "2026-01-01 00:00:00 line " << i << "\n";
  }
}

TEST_F(WebApiTest, JobsList_EverySortKeyBothWays_StateFilter) {
  ASSERT_NO_FATAL_FAILURE(Start({}, [](const std::string& state) { SeedJobs(state, 0, 0); }));
  const std::vector<SeededJob>& seeded = SeededJobs();
  // What the coordinator restored, by id: the values the orders must follow.
  std::map<std::string, v1::JobStatus> restored;
  for (const SeededJob& j : seeded) {
    auto got = http_->Get("/api/v1/jobs/" + j.id);
    ASSERT_TRUE(got && got->status == 200) << j.id;
    restored[j.id] = Parse<v1::JobStatus>(got->body);
    EXPECT_EQ(restored[j.id].state(), j.state) << j.id;
    EXPECT_EQ(restored[j.id].progress().global_step(), j.step) << j.id;
  }
  using Less = std::function<bool(const v1::JobStatus&, const v1::JobStatus&)>;
  const std::vector<std::pair<std::string, Less>> keys = {
      {"id", [](const auto& a, const auto& b) { return a.id() < b.id(); }},
      {"name", [](const auto& a, const auto& b) { return a.name() < b.name(); }},
      {"state", [](const auto& a, const auto& b) { return a.state() < b.state(); }},
      {"step",
       [](const auto& a, const auto& b) {
         return a.progress().global_step() < b.progress().global_step();
       }},
      {"samples_per_second",
       [](const auto& a, const auto& b) {
         return a.progress().samples_per_second() < b.progress().samples_per_second();
       }},
  };
  auto listed = [&](const std::string& query) {
    std::vector<std::string> ids;
    auto got = http_->Get("/api/v1/jobs?" + query);
    EXPECT_TRUE(got && got->status == 200) << query;
    if (!got) return ids;
    const v1::ListJobsResponse page = Parse<v1::ListJobsResponse>(got->body);
    EXPECT_EQ(page.total_size(), page.jobs_size()) << query;
    for (const v1::JobStatus& j : page.jobs()) ids.push_back(j.id());
    return ids;
  };
  std::vector<std::string> submitted;
  for (const SeededJob& j : seeded) submitted.push_back(j.id);
  EXPECT_EQ(listed("sort=submitted&order=asc"), submitted);
  EXPECT_EQ(listed(""), std::vector<std::string>(submitted.rbegin(), submitted.rend()))
      << "newest first by default";
  std::set<std::vector<std::string>> orders = {submitted};
  for (const auto& [key, less] : keys) {
    for (const std::string order : {"asc", "desc"}) {
      SCOPED_TRACE(key + " " + order);
      const std::vector<std::string> ids = listed("sort=" + key + "&order=" + order);
      ASSERT_EQ(ids.size(), seeded.size());
      // Each neighbouring pair in order, and only ties (two FAILED jobs by state) in either.
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const v1::JobStatus& a = restored[ids[i]];
        const v1::JobStatus& b = restored[ids[i + 1]];
        EXPECT_FALSE(order == "asc" ? less(b, a) : less(a, b))
            << ids[i] << " before " << ids[i + 1];
        if (key != "state") {
          EXPECT_TRUE(less(a, b) || less(b, a)) << "a tie: " << ids[i];
        }
      }
      if (order == "asc") orders.insert(ids);
    }
  }
  // The data tells the keys apart: six different orders (a sort that ignored its key fails).
  EXPECT_EQ(orders.size(), keys.size() + 1);
  EXPECT_EQ(listed("sort=step&order=asc"),
            (std::vector<std::string>{"sweep-1", "run-3", "eval-1", "run-2-1", "probe-1"}));

  // state=: exactly the jobs in that state, sorted as asked.
  EXPECT_EQ(listed("state=FAILED&sort=step&order=desc"),
            (std::vector<std::string>{"probe-1", "sweep-1"}));
  EXPECT_EQ(listed("state=QUEUED"), (std::vector<std::string>{"eval-1"}));
  EXPECT_EQ(listed("state=RUNNING"), std::vector<std::string>());
  auto bad = http_->Get("/api/v1/jobs?state=DONE");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("state 'DONE' is not QUEUED, RUNNING"));
  auto bad_order = http_->Get("/api/v1/jobs?order=up");
  ASSERT_TRUE(bad_order);
  EXPECT_EQ(bad_order->status, 400);
}

// (id, state) of each "job" event of a text/event-stream.
std::set<std::pair<std::string, v1::JobState>> Events(const std::string& stream) {
  std::set<std::pair<std::string, v1::JobState>> out;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ")) continue;
    v1::JobStatus job;
    if (!google::protobuf::util::JsonStringToMessage(std::string(line), &job).ok()) continue;
    out.insert({job.id(), job.state()});
  }
  return out;
}

// The all-jobs event stream: its first round sends only what has not ended (the history is the
// page's to load from /api/v1/jobs), then every change, a job that was submitted and ended
// between two rounds included; /api/v1/cluster counts the history by state.
TEST_F(WebApiTest, EventsForAllJobs_HistoryNotSent_AJobEndedBetweenRoundsIs) {
  ASSERT_NO_FATAL_FAILURE(Start({}, [](const std::string& state) { SeedJobs(state, 0, 0); }));
  auto summary = http_->Get("/api/v1/cluster");
  ASSERT_TRUE(summary && summary->status == 200);
  const v1::ClusterSummary counted = Parse<v1::ClusterSummary>(summary->body);
  EXPECT_EQ(counted.jobs_by_state().at("QUEUED"), 1);
  EXPECT_EQ(counted.jobs_by_state().at("SUCCEEDED"), 1);
  EXPECT_EQ(counted.jobs_by_state().at("FAILED"), 2);
  EXPECT_EQ(counted.jobs_by_state().at("CANCELLED"), 1);
  EXPECT_EQ(counted.jobs_by_state().count("RUNNING"), 0u);

  absl::Mutex mu;
  std::string stream;
  httplib::Client sse("127.0.0.1", port_);
  sse.set_read_timeout(20, 0);
  std::thread reader([&] {
    sse.Get("/api/v1/events", [&](const char* data, size_t n) {
      absl::MutexLock lock(&mu);
      stream.append(data, n);
      return true;
    });
  });
  auto streamed = [&] {
    absl::MutexLock lock(&mu);
    return stream;
  };
  // The stream is stopped from here whatever fails (its keep-alives outrun any read timeout),
  // so the reader is always joined.
  if (WaitFor(
          [&] {
            return Events(streamed()).count({"eval-1", v1::QUEUED}) == 1;
          },
          absl::Seconds(10))) {
    // No worker: the job waits queued, and is cancelled well within a round's 500 ms.
    const std::string id = cluster_->Submit("quick", SyntheticDdpJob("quick", 1, 64));
    EXPECT_EQ(id, "quick-1");
    grpc::ClientContext context;
    v1::CancelJobRequest cancel;
    cancel.set_id(id);
    v1::JobStatus cancelled;
    EXPECT_TRUE(cluster_->jobs().CancelJob(&context, cancel, &cancelled).ok());
    // Two rounds of 500 ms are ample; the old stream never sent it.
    WaitFor(
        [&] {
          return Events(streamed()).count({"quick-1", v1::CANCELLED}) == 1;
        },
        absl::Seconds(5));
  }
  sse.stop();
  reader.join();
  const std::set<std::pair<std::string, v1::JobState>> events = Events(streamed());
  EXPECT_EQ(events.count({"quick-1", v1::CANCELLED}), 1u) << streamed();
  EXPECT_EQ(events.count({"eval-1", v1::QUEUED}), 1u) << streamed();
  for (const auto& [job, state] : events) {
    EXPECT_TRUE(job == "eval-1" || job == "quick-1")
        << job << " ended before the stream opened: " << streamed();
  }
}

// One answer holds at most 10,000 metric points and 2,000 log lines (docs/dashboard.md); the
// rest comes from since / offset, and `truncated` says there is more.
TEST_F(WebApiTest, MetricsAndLogs_CappedPerAnswer_RestFromSinceAndOffset) {
  ASSERT_NO_FATAL_FAILURE(
      Start({}, [](const std::string& state) { SeedJobs(state, 10050, 2050); }));
  auto first = http_->Get("/api/v1/jobs/run-2-1/metrics?since=0");
  ASSERT_TRUE(first && first->status == 200);
  const v1::GetJobMetricsResponse points = Parse<v1::GetJobMetricsResponse>(first->body);
  EXPECT_EQ(points.points_size(), 10000);
  EXPECT_EQ(points.next_point(), 10000);
  EXPECT_TRUE(points.truncated());
  EXPECT_EQ(points.points(9999).step(), 9999);
  auto rest = http_->Get("/api/v1/jobs/run-2-1/metrics?since=10000");
  ASSERT_TRUE(rest && rest->status == 200);
  const v1::GetJobMetricsResponse more = Parse<v1::GetJobMetricsResponse>(rest->body);
  EXPECT_EQ(more.points_size(), 50);
  EXPECT_EQ(more.points(0).step(), 10000);
  EXPECT_EQ(more.next_point(), 10050);
  EXPECT_FALSE(more.truncated());

  auto head = http_->Get("/api/v1/jobs/run-2-1/logs?offset=0");
  ASSERT_TRUE(head && head->status == 200);
  const v1::GetJobLogsResponse lines = Parse<v1::GetJobLogsResponse>(head->body);
  EXPECT_EQ(lines.lines_size(), 2000);
  EXPECT_EQ(lines.next_line(), 2000);
  EXPECT_TRUE(lines.truncated());
  EXPECT_THAT(lines.lines(1999), HasSubstr(" line 1999"));
  auto tail = http_->Get("/api/v1/jobs/run-2-1/logs?offset=2000");
  ASSERT_TRUE(tail && tail->status == 200);
  const v1::GetJobLogsResponse last = Parse<v1::GetJobLogsResponse>(tail->body);
  EXPECT_EQ(last.lines_size(), 50);
  EXPECT_THAT(last.lines(0), HasSubstr(" line 2000"));
  EXPECT_EQ(last.next_line(), 2050);
  EXPECT_FALSE(last.truncated());
}

}  // namespace web_api_test
}  // namespace dtrain::testing

// Prometheus metrics over HTTP: the registry's text format, and the coordinator's and a
// worker's /metrics after a real job, whose counts must match what the job did.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/metrics_registry.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace metrics_endpoint_test {

using ::testing::HasSubstr;

// "name{labels} value" lines -> value; HELP/TYPE lines are skipped.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  static const std::regex line(R"(^([a-z_]+(\{[^}]*\})?) (\S+)$)");
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, line)) out[m[1]] = std::stod(m[3]);
  }
  return out;
}

std::string Scrape(int port) {
  httplib::Client client("127.0.0.1", port);
  auto response = client.Get("/metrics");
  if (!response || response->status != 200) return "";
  EXPECT_THAT(response->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  return response->body;
}

TEST(MetricsRegistry, TextFormat_CountersHistogramsGauges) {
  MetricsRegistry r;
  r.DescribeCounter("c_total", "A counter.");
  r.DescribeHistogram("h_seconds", "A histogram.", {0.1, 1});
  r.AddGauge("g", "A gauge.", [](const auto& emit) { emit({{"state", "A\"B"}}, 2); });
  r.Increment("c_total", {{"kind", "x"}}, 3);
  r.Increment("c_total", {{"kind", "x"}});
  r.Observe("h_seconds", {}, 0.05);
  r.Observe("h_seconds", {}, 0.5);
  r.Observe("h_seconds", {}, 7);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP c_total A counter.\n# TYPE c_total counter\n"
                              "c_total{kind=\"x\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.1\"} 1\n"
                              "h_seconds_bucket{le=\"1\"} 2\nh_seconds_bucket{le=\"+Inf\"} 3\n"
                              "h_seconds_sum 7.55\nh_seconds_count 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE g gauge\ng{state=\"A\\\"B\"} 2\n"));
}

TEST(MetricsEndpoint, CoordinatorAndWorker_CountWhatAJobDid) {
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/metrics-", getpid()));
  // Both /metrics servers bind port 0 and say which port they got; the gRPC port files are
  // written after them, so they are there once the processes serve.
  const std::string coordinator_port_file = cluster.dir() + "/coordinator-metrics.port";
  const std::string worker_port_file = cluster.dir() + "/w0-metrics.port";
  ASSERT_TRUE(cluster.StartCoordinator(
      "127.0.0.1:0",
      {"--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + coordinator_port_file}));
  ASSERT_TRUE(cluster.AddWorker(
      "w0", {"--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + worker_port_file}));
  const int coordinator_port = WaitForPortFile(coordinator_port_file, absl::Seconds(5));
  const int worker_port = WaitForPortFile(worker_port_file, absl::Seconds(5));
  ASSERT_GT(coordinator_port, 0);
  ASSERT_GT(worker_port, 0);
  ASSERT_TRUE(cluster.AddWorker("w1"));
  ASSERT_TRUE(WaitFor([&] { return cluster.AliveWorkers() == 2; }, absl::Seconds(10)));
  // 1024 samples over 2 ranks in batches of 32: 16 training batches per rank. On the
  // coordinator's plane (grpc), so that its collectives are counted here.
  const std::string id =
      cluster.Submit("m", SyntheticDdpJob("m", 1, 1024, ", collective_backend: grpc"));
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(cluster.GetJob(id).state()); }, absl::Seconds(120)));
  ASSERT_EQ(cluster.GetJob(id).state(), v1::SUCCEEDED);
  // Scrape once both workers are let go (a success is published after that; checked anyway).
  ASSERT_TRUE(
      WaitFor([&] { return cluster.AliveWorkers(/*idle_only=*/true) == 2; }, absl::Seconds(30)));

  const std::map<std::string, double> c = Samples(Scrape(coordinator_port));
  ASSERT_FALSE(c.empty()) << "no coordinator /metrics";
  EXPECT_EQ(c.at("dtrain_jobs{state=\"SUCCEEDED\"}"), 1);
  EXPECT_EQ(c.at("dtrain_jobs{state=\"RUNNING\"}"), 0);
  EXPECT_EQ(c.at("dtrain_workers{state=\"ALIVE\"}"), 2);
  EXPECT_EQ(c.at("dtrain_heartbeat_deaths_total"), 0);
  const double all_reduces = c.at("dtrain_collectives_total{kind=\"all_reduce\",outcome=\"ok\"}");
  EXPECT_GE(all_reduces, 16) << "one gradient all_reduce per training step at least";
  EXPECT_EQ(c.at("dtrain_collective_latency_seconds_count{kind=\"all_reduce\"}"), all_reduces);
  EXPECT_EQ(c.at("dtrain_collective_latency_seconds_bucket{kind=\"all_reduce\",le=\"+Inf\"}"),
            all_reduces);
  EXPECT_GT(c.at("dtrain_collective_bytes_total{kind=\"all_reduce\"}"), 0);

  const std::map<std::string, double> w = Samples(Scrape(worker_port));
  ASSERT_FALSE(w.empty()) << "no worker /metrics";
  EXPECT_EQ(w.at("dtrain_worker_batches_total{kind=\"training\"}"), 16);
  EXPECT_GE(w.at("dtrain_worker_step_calls_total{kind=\"training\",outcome=\"ok\"}"), 1);
  EXPECT_EQ(w.at("dtrain_worker_step_call_seconds_count{kind=\"training\"}"),
            w.at("dtrain_worker_step_calls_total{kind=\"training\",outcome=\"ok\"}"));
  EXPECT_EQ(w.at("dtrain_worker_job{job=\"\"}"), 0) << "torn down after the job";
  // The job's last.ckpt, sent by rank 0 to the coordinator.
  v1::JobStatus first_job = cluster.GetJob("m-1");
  ASSERT_EQ(first_job.files_size(), 1);
  const double checkpoint_bytes = static_cast<double>(first_job.files(0).size_bytes());
  EXPECT_GT(checkpoint_bytes, 100000);
  EXPECT_EQ(c.at("dtrain_artifact_bytes"), checkpoint_bytes);
  EXPECT_EQ(w.at("dtrain_worker_artifact_cache_misses_total"), 0);

  // A data file sent with two jobs: stored once on the coordinator, fetched once by each
  // worker, a cache hit the second time.
  const std::string data = cluster.dir() + "/data.pt";
  CommandResult made = RunShell(
      "/usr/bin/python3 -c 'import torch; x = torch.randn(128, 784); "
      "y = torch.randint(0, 10, (128,)); torch.save({\"train\": (x, y), \"val\": (x, y)}, \"" +
      data + "\")'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  for (const char* name : {"d1", "d2"}) {
    const std::string job = cluster.Submit(name, absl::StrCat("name: ", name, R"(
model: {builtin: mlp}
data: {tensors_file: data.pt, batch_size: 32}
trainer: {max_epochs: 1, num_nodes: 2, skip_test: true}
)"));
    ASSERT_FALSE(job.empty());
    ASSERT_TRUE(
        WaitFor([&] { return IsTerminal(cluster.GetJob(job).state()); }, absl::Seconds(120)));
    ASSERT_EQ(cluster.GetJob(job).state(), v1::SUCCEEDED) << cluster.GetJob(job).reason();
    ASSERT_TRUE(
        WaitFor([&] { return cluster.AliveWorkers(/*idle_only=*/true) == 2; }, absl::Seconds(30)));
  }
  // Stored: the data once, and each job's last.ckpt (the same bytes for both: same seed,
  // same data, same spec, so one file).
  double checkpoints = 0;
  std::set<std::string> digests;
  for (const char* job : {"d1-1", "d2-1"}) {
    const v1::JobStatus status = cluster.GetJob(job);
    for (const v1::JobFile& f : status.files()) {
      if (digests.insert(f.digest()).second) checkpoints += static_cast<double>(f.size_bytes());
    }
  }
  const double data_bytes = static_cast<double>(std::filesystem::file_size(data));
  const std::map<std::string, double> c2 = Samples(Scrape(coordinator_port));
  EXPECT_EQ(c2.at("dtrain_artifact_bytes"), checkpoint_bytes + data_bytes + checkpoints);
  const std::map<std::string, double> w2 = Samples(Scrape(worker_port));
  EXPECT_EQ(w2.at("dtrain_worker_artifact_cache_misses_total"), 1);
  EXPECT_EQ(w2.at("dtrain_worker_artifact_cache_hits_total"), 1);
  EXPECT_EQ(w2.at("dtrain_worker_artifact_cache_tampered_total"), 0);
  // The data, plus the checkpoints this worker wrote as rank 0 (kept without a fetch).
  EXPECT_GE(w2.at("dtrain_worker_artifact_cache_bytes"), data_bytes);
}

}  // namespace metrics_endpoint_test
}  // namespace dtrain::testing

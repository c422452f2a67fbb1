// The coordinator at cluster scale, simulated on one machine (bench/coordinator_scale.sh).
//
// --seed_db: writes --ended_jobs finished jobs (with metric points) into a coordinator database,
// as months of use leave it, and exits.
//
// Otherwise it plays a cluster against a running dtrain-coordinator:
// - --workers worker daemons, each with its own gRPC connection, registering and heartbeating at
//   the interval the coordinator hands out (the daemon's loop,
//   worker/service/worker_registration.cc);
// - their Worker service: one server answers for all of them, telling them apart by the address
//   each registered (127.1.x.y, all on this host's loopback), joins each job's ranks in process
//   and answers steps after --batch_ms per batch, as a model computing would (the dataset it
//   reports is Fashion-MNIST's size, so epochs end, validate and checkpoint as they would);
// - --running jobs of --nodes_per_job workers training (progress and metrics flow to the
//   coordinator every step), then --queued jobs waiting behind them.
// Over a steady window it measures heartbeat latency, the coordinator's CPU and memory, and the
// wall time of `dtrain list` and `dtrain workers`; then it lets the running jobs go and checks
// that the queued ones start in submission order. Prints one JSON object.
//
// Beside each figure, a same-run reference from this machine at the same moment, so that the
// ratio carries to another machine: a loopback gRPC round trip with no work behind it (a
// Worker.Health call to the simulator's own server, which serves the 1,000 daemons' traffic at
// the same time, over a connection of its own, every 50 ms of the window) for the heartbeat
// latency; the simulator's own CPU (the other side of the same traffic) for the coordinator's;
// `dtrain --help` (the CLI's start and exit, no RPC) for the list and workers commands.
//
// The simulated cluster (its daemons and Worker service) is bench/simulated_cluster.h.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/percentile.h"
#include "bench/simulated_cluster.h"
#include "coordinator/jobs/job_store.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "dtrain/v1/worker.grpc.pb.h"
#include "dtrain/v1/workers.grpc.pb.h"

ABSL_FLAG(std::string, seed_db, "", "write ended jobs into this coordinator database and exit");
ABSL_FLAG(int, ended_jobs, 10000, "with --seed_db: finished jobs to write");
ABSL_FLAG(int, metric_points, 20, "with --seed_db: metric points per finished job");
ABSL_FLAG(std::string, coordinator, "", "the coordinator's address");
ABSL_FLAG(int, coordinator_pid, 0, "its pid, for CPU and memory");
ABSL_FLAG(std::string, dtrain, "", "the dtrain CLI, timed for list and workers");
ABSL_FLAG(int, workers, 1000, "simulated worker daemons");
ABSL_FLAG(int, running, 32, "jobs training during the window");
ABSL_FLAG(int, queued, 200, "jobs queued behind them");
ABSL_FLAG(int, nodes_per_job, 31, "workers per job");
ABSL_FLAG(int, batch_ms, 100, "simulated compute per batch");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(20), "before the window: placement, setup");
ABSL_FLAG(absl::Duration, window, absl::Seconds(40), "the steady state measured");
ABSL_FLAG(absl::Duration, drain_deadline, absl::Minutes(4), "for the queued jobs to finish");

namespace dtrain {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Percentile;

// ---- Seeding ---------------------------------------------------------------------------------

int Seed(const std::string& path, int jobs, int points) {
  auto store = JobStore::Open(path);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < jobs; ++i) {
    v1::JobSpec spec;
    spec.set_name(absl::StrCat("history", i));
    spec.mutable_model()->set_builtin(i % 2 ? "mlp" : "cnn");
    spec.mutable_data()->set_builtin("fashion-mnist");
    spec.mutable_data()->set_batch_size(64);
    spec.mutable_trainer()->set_max_epochs(2);
    spec.mutable_trainer()->set_num_nodes(2);
    spec.mutable_trainer()->set_strategy("ddp");
    spec.mutable_optimizer()->set_name("sgd");
    spec.mutable_optimizer()->set_lr(0.05);
    v1::JobStatus status;
    status.set_id(absl::StrCat("history", i, "-1"));
    status.set_name(spec.name());
    status.set_state(i % 10 == 9 ? v1::FAILED : v1::SUCCEEDED);
    if (status.state() == v1::FAILED) status.set_reason("worker 'w3' (rank 1) died");
    const int64_t submitted = now - int64_t{3600000} * 24 * 60 + int64_t{i} * 1000;
    status.set_submitted_unix_ms(submitted);
    status.set_started_unix_ms(submitted + 200);
    status.set_finished_unix_ms(submitted + 60000);
    status.mutable_progress()->set_phase("done");
    status.mutable_progress()->set_global_step(1876);
    status.mutable_progress()->set_total_steps(1876);
    (*status.mutable_metrics())["train_loss"] = 0.25;
    (*status.mutable_metrics())["val_acc"] = 0.91;
    (*status.mutable_metrics())["test_acc"] = 0.9;
    status.add_workers("w0");
    status.add_workers("w1");
    if (absl::Status s = (*store)->Insert(spec, status); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    for (int p = 0; p < points; ++p) {
      v1::MetricPoint point;
      point.set_name("train_loss");
      point.set_step(p * 10);
      point.set_value(2.0 / (p + 1));
      if (absl::Status s = (*store)->AddMetric(status.id(), point); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "seeded %d ended jobs (%d metric points each) into %s\n", jobs, points,
               path.c_str());
  return 0;
}

// ---- Measurements ----------------------------------------------------------------------------

// utime + stime of `pid`, in seconds.
double CpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) start after the last ')'.
  const std::vector<std::string> fields =
      absl::StrSplit(text.substr(text.rfind(')') + 2), ' ', absl::SkipEmpty());
  double utime = 0, stime = 0;
  if (fields.size() > 13) {
    (void)absl::SimpleAtod(fields[11], &utime);
    (void)absl::SimpleAtod(fields[12], &stime);
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

// A /proc/PID/status field in kB (VmRSS, VmHWM).
long StatusKiB(int pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
    }
  }
  return 0;
}

// Loopback round trips with no work behind them, one every 50 ms until `until`: Worker.Health on
// the simulator's own server (a map lookup), over a connection of its own, set up first so that
// the first sample is not a connection's.
struct RoundTrips {
  std::vector<double> ms;
  int failed = 0;
};
RoundTrips ProbeRoundTrips(int port, absl::Time until) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  RoundTrips trips;
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(5)))) {
    trips.failed = 1;
    return trips;
  }
  auto stub = v1::Worker::NewStub(channel);
  while (absl::Now() < until) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::HealthRequest request;
    v1::HealthResponse response;
    const absl::Time sent = absl::Now();
    if (stub->Health(&context, request, &response).ok()) {
      trips.ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - sent));
    } else {
      ++trips.failed;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return trips;
}

// Wall time (ms) of one CLI run, its output discarded; -1 if it failed.
double TimeCommand(const std::string& command) {
  const absl::Time start = absl::Now();
  const int rc = std::system((command + " > /dev/null 2>&1").c_str());
  return rc == 0 ? absl::ToDoubleMilliseconds(absl::Now() - start) : -1;
}

v1::JobSpec JobSpecFor(const std::string& name, int nodes, int64_t max_steps) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_builtin("cnn");
  spec.mutable_data()->set_builtin("fashion-mnist");
  spec.mutable_data()->set_batch_size(64);
  spec.mutable_data()->set_shuffle(false);
  v1::TrainerConfig* t = spec.mutable_trainer();
  t->set_max_steps(max_steps);
  t->set_num_nodes(nodes);
  t->set_strategy("ddp");
  t->set_limit_val_batches(1);
  t->set_skip_test(true);
  // 16 batches a call, the default until 2026-11-25: the heavier load on the coordinator (sized
  // calls, the default now, last ~0.25 s each and come less often).
  t->set_batches_per_call(16);
  spec.mutable_checkpoint()->set_dirpath("worker:/tmp/dtrain-scale-bench");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_lr(0.05);
  return spec;
}

int Run() {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const int n = absl::GetFlag(FLAGS_workers);
  const int pid = absl::GetFlag(FLAGS_coordinator_pid);
  Timer timer;

  // The Worker service of all simulated daemons, on every loopback address.
  SimulatedWorkers service(n, absl::Milliseconds(absl::GetFlag(FLAGS_batch_ms)), &timer);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("0.0.0.0:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "cannot serve the simulated workers\n");
    return 1;
  }

  Daemons daemons(coordinator, n, port, &service);
  const absl::Time registering = absl::Now();
  if (absl::Status s = daemons.RegisterAll(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const double register_s = absl::ToDoubleSeconds(absl::Now() - registering);
  daemons.Start();
  std::fprintf(stderr, "%d simulated workers registered in %.1f s; heartbeat every %s\n", n,
               register_s, absl::FormatDuration(daemons.interval()).c_str());

  auto jobs =
      v1::Jobs::NewStub(grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  auto submit = [&](const v1::JobSpec& spec) -> std::string {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    grpc::Status s = jobs->SubmitJob(&context, request, &response);
    if (!s.ok()) {
      std::fprintf(stderr, "submit %s: %s\n", spec.name().c_str(), s.error_message().c_str());
      return "";
    }
    return response.job().id();
  };
  const int nodes = absl::GetFlag(FLAGS_nodes_per_job);
  const absl::Duration warmup = absl::GetFlag(FLAGS_warmup);
  const absl::Duration window = absl::GetFlag(FLAGS_window);
  // Long enough to train through the warm-up and the window.
  const int64_t long_steps = static_cast<int64_t>(absl::ToDoubleMilliseconds(warmup + window) /
                                                  absl::GetFlag(FLAGS_batch_ms) * 2);
  std::vector<std::string> running, queued;
  for (int j = 0; j < absl::GetFlag(FLAGS_running); ++j) {
    running.push_back(submit(JobSpecFor(absl::StrCat("running", j), nodes, long_steps)));
  }
  for (int j = 0; j < absl::GetFlag(FLAGS_queued); ++j) {
    queued.push_back(submit(JobSpecFor(absl::StrCat("queued", j), nodes, 4)));
  }
  const absl::Time window_start = absl::Now() + warmup;
  const absl::Time window_end = window_start + window;
  daemons.Window(window_start, window_end);
  absl::SleepFor(window_start - absl::Now());
  const double cpu_before = CpuSeconds(pid), own_cpu_before = CpuSeconds(getpid());
  RoundTrips reference;
  std::thread prober([&] { reference = ProbeRoundTrips(port, window_end); });
  std::vector<double> list_ms, workers_ms, help_ms;
  const std::string cli = absl::StrCat(absl::GetFlag(FLAGS_dtrain), " --coordinator=", coordinator);
  for (int k = 0; k < 5; ++k) {
    absl::SleepFor(window / 12);
    list_ms.push_back(TimeCommand(cli + " list"));
    workers_ms.push_back(TimeCommand(cli + " workers"));
    help_ms.push_back(TimeCommand(absl::GetFlag(FLAGS_dtrain) + " --help"));
  }
  absl::SleepFor(window_end - absl::Now());
  const double cpu_after = CpuSeconds(pid), own_cpu_after = CpuSeconds(getpid());
  prober.join();
  const long rss_kib = StatusKiB(pid, "VmRSS");

  // Running jobs in the window, and their progress.
  int training = 0;
  int64_t steps_done = 0;
  for (const std::string& id : running) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id(id);
    v1::JobStatus status;
    if (jobs->GetJob(&context, request, &status).ok() && status.state() == v1::RUNNING) {
      ++training;
      steps_done += status.progress().global_step();
    }
  }

  // Let the running jobs go: the queue drains in submission order.
  const absl::Time draining = absl::Now();
  for (const std::string& id : running) {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(id);
    v1::JobStatus status;
    (void)jobs->CancelJob(&context, request, &status);
  }
  std::vector<v1::JobStatus> ended;
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_drain_deadline);
  while (absl::Now() < deadline) {
    ended.clear();
    for (const std::string& id : queued) {
      grpc::ClientContext context;
      v1::GetJobRequest request;
      request.set_id(id);
      v1::JobStatus status;
      if (jobs->GetJob(&context, request, &status).ok()) ended.push_back(status);
    }
    const bool all = std::all_of(ended.begin(), ended.end(), [](const v1::JobStatus& s) {
      return s.state() == v1::SUCCEEDED || s.state() == v1::FAILED || s.state() == v1::CANCELLED;
    });
    if (all && static_cast<int>(ended.size()) == static_cast<int>(queued.size())) break;
    absl::SleepFor(absl::Seconds(1));
  }
  const double drain_s = absl::ToDoubleSeconds(absl::Now() - draining);
  int succeeded = 0, in_order = 0;
  int64_t previous_start = 0;
  std::string first_failure;
  for (const v1::JobStatus& s : ended) {
    if (s.state() == v1::SUCCEEDED) ++succeeded;
    if (s.state() != v1::SUCCEEDED && first_failure.empty()) {
      first_failure = absl::StrCat(s.id(), " ", v1::JobState_Name(s.state()), ": ", s.reason());
    }
    if (s.started_unix_ms() > 0 && s.started_unix_ms() >= previous_start) ++in_order;
    previous_start = std::max(previous_start, s.started_unix_ms());
  }
  const std::vector<double> latencies = daemons.WindowLatencies();
  daemons.Stop();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server->Wait();

  auto median = [](std::vector<double> v) { return Percentile(std::move(v), 0.5); };
  auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  std::printf(
      "{\"workers\": %d, \"register_s\": %.2f, \"heartbeat_interval_ms\": %.0f, "
      "\"heartbeats_in_window\": %zu, \"heartbeat_failures\": %lld, "
      "\"heartbeat_p50_ms\": %.2f, \"heartbeat_p99_ms\": %.2f, \"heartbeat_max_ms\": %.2f, "
      "\"running_jobs\": %d, \"nodes_per_job\": %d, \"steps_at_window_end\": %lld, "
      "\"window_s\": %.0f, \"coordinator_cpu_pct\": %.1f, \"coordinator_rss_mib\": %.1f, "
      "\"coordinator_peak_rss_mib\": %.1f, \"list_ms_median\": %.1f, \"list_ms_max\": %.1f, "
      "\"workers_ms_median\": %.1f, \"workers_ms_max\": %.1f, \"queued_jobs\": %zu, "
      "\"queued_succeeded\": %d, \"queued_started_in_order\": %d, \"drain_s\": %.1f, "
      "\"reference_rtt_p50_ms\": %.2f, \"reference_rtt_p99_ms\": %.2f, "
      "\"reference_rtt_failures\": %d, "
      "\"simulator_cpu_pct\": %.1f, \"cli_start_ms_median\": %.1f, \"first_failure\": \"%s\"}\n",
      n, register_s, absl::ToDoubleMilliseconds(daemons.interval()), latencies.size(),
      static_cast<long long>(daemons.failures()), Percentile(latencies, 0.5),
      Percentile(latencies, 0.99), latencies.empty() ? 0.0 : worst(latencies), training, nodes,
      static_cast<long long>(steps_done), absl::ToDoubleSeconds(window),
      100 * (cpu_after - cpu_before) / absl::ToDoubleSeconds(window), rss_kib / 1024.0,
      StatusKiB(pid, "VmHWM") / 1024.0, median(list_ms), worst(list_ms), median(workers_ms),
      worst(workers_ms), queued.size(), succeeded, in_order, drain_s, Percentile(reference.ms, 0.5),
      Percentile(reference.ms, 0.99), reference.failed,
      100 * (own_cpu_after - own_cpu_before) / absl::ToDoubleSeconds(window), median(help_ms),
      first_failure.c_str());
  return 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_seed_db).empty()) {
    return dtrain::Seed(absl::GetFlag(FLAGS_seed_db), absl::GetFlag(FLAGS_ended_jobs),
                        absl::GetFlag(FLAGS_metric_points));
  }
  if (absl::GetFlag(FLAGS_coordinator).empty() || absl::GetFlag(FLAGS_coordinator_pid) <= 0) {
    std::fprintf(stderr, "--coordinator and --coordinator_pid are required (or --seed_db)\n");
    return 2;
  }
  return dtrain::Run();
}

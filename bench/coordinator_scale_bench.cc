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
// The simulated Worker service is a bench's stand-in for 1,000 machines; no test uses it.
#include <sys/resource.h>
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

// ---- Deferred work ---------------------------------------------------------------------------

// Runs callbacks at given times on one thread: the simulated compute of every step.
class Timer {
 public:
  Timer() : thread_([this] { Loop(); }) {}
  ~Timer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void At(absl::Time when, std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    queue_.push({when, seq_++, std::move(f)});
  }

 private:
  struct Item {
    absl::Time when;
    int64_t seq;
    std::function<void()> f;
    bool operator>(const Item& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  void Loop() {
    while (true) {
      std::function<void()> f;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || (!queue_.empty() && queue_.top().when <= absl::Now());
        };
        const absl::Time wake =
            queue_.empty() ? absl::Now() + absl::Milliseconds(20) : queue_.top().when;
        mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
        if (stop_) return;
        if (queue_.empty() || queue_.top().when > absl::Now()) continue;
        f = std::move(const_cast<Item&>(queue_.top()).f);
        queue_.pop();
      }
      f();
    }
  }
  absl::Mutex mu_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// ---- The simulated workers' Worker service ---------------------------------------------------

// Worker i listens (as far as the coordinator knows) at 127.1.(i / 250).(i % 250 + 1):port.
std::string WorkerHost(int i) { return absl::StrCat("127.1.", i / 250, ".", i % 250 + 1); }

class SimulatedWorkers final : public v1::Worker::CallbackService {
 public:
  SimulatedWorkers(int workers, absl::Duration batch_time, Timer* timer)
      : batch_time_(batch_time), timer_(timer), jobs_(workers) {
    for (int i = 0; i < workers; ++i) index_[WorkerHost(i)] = i;
  }
  // The job worker i runs ("" when idle): its heartbeat reports it.
  std::string JobOf(int i) {
    absl::MutexLock lock(&mu_);
    return jobs_[i].job;
  }

  grpc::ServerUnaryReactor* Setup(grpc::CallbackServerContext* context,
                                  const v1::SetupRequest* request,
                                  v1::SetupResponse* response) override {
    auto* reactor = context->DefaultReactor();
    const int me = Index(context);
    if (me < 0) {
      reactor->Finish(grpc::Status(grpc::INVALID_ARGUMENT, "unknown simulated worker"));
      return reactor;
    }
    const std::string group =
        request->group().group().empty() ? request->job_id() : request->group().group();
    const int world = std::max(1, request->group().world_size());
    std::vector<Pending> complete;
    {
      absl::MutexLock lock(&mu_);
      jobs_[me] = {request->job_id(), 0, 0};
      auto& pending = groups_[group];
      pending.push_back({me, reactor, response});
      if (static_cast<int>(pending.size()) == world) {
        complete = std::move(pending);
        groups_.erase(group);
        // Ranks in worker order, as the rendezvous orders them by name.
        std::sort(complete.begin(), complete.end(),
                  [](const Pending& a, const Pending& b) { return a.worker < b.worker; });
        for (int r = 0; r < world; ++r) jobs_[complete[r].worker].rank = r;
      }
    }
    for (int r = 0; r < static_cast<int>(complete.size()); ++r) {
      v1::SetupResponse* out = complete[r].response;
      v1::RankInfo* rank = out->add_ranks();
      rank->set_rank(r);
      rank->set_node_rank(r);
      rank->set_world_size(world);
      rank->set_pid(getpid());
      for (const auto& [name, size] :
           std::vector<std::pair<std::string, int64_t>>{{"train", 60000}, {"val", 10000}}) {
        v1::SplitInfo* split = out->add_splits();
        split->set_name(name);
        split->set_size(size);
      }
      out->set_parameter_count(101770);
      out->set_root_device("cpu");
      out->set_parameter_dtype("float32");
      out->set_collective_plane("gloo");
      complete[r].reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  grpc::ServerUnaryReactor* TrainingStep(grpc::CallbackServerContext* context,
                                         const v1::StepRequest* request,
                                         v1::StepResponse* response) override {
    return Step(context, request, response, /*training=*/true);
  }
  grpc::ServerUnaryReactor* ValidationStep(grpc::CallbackServerContext* context,
                                           const v1::StepRequest* request,
                                           v1::StepResponse* response) override {
    return Step(context, request, response, /*training=*/false);
  }
  grpc::ServerUnaryReactor* TestStep(grpc::CallbackServerContext* context,
                                     const v1::StepRequest* request,
                                     v1::StepResponse* response) override {
    return Step(context, request, response, /*training=*/false);
  }
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* context,
                                           const v1::SaveCheckpointRequest* request,
                                           v1::SaveCheckpointResponse* response) override {
    auto* reactor = context->DefaultReactor();
    const int me = Index(context);
    {
      absl::MutexLock lock(&mu_);
      response->add_written(me >= 0 && jobs_[me].rank == 0);
    }
    response->set_bytes(407000);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* ReduceBooleanDecision(grpc::CallbackServerContext* context,
                                                  const v1::DecisionRequest* request,
                                                  v1::DecisionResponse* response) override {
    auto* reactor = context->DefaultReactor();
    // As one group would decide, for this worker's ranks.
    bool decision = request->all();
    for (bool d : request->decisions()) decision = request->all() ? decision && d : decision || d;
    response->set_decision(decision);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Teardown(grpc::CallbackServerContext* context,
                                     const v1::TeardownRequest* request,
                                     v1::TeardownResponse* response) override {
    auto* reactor = context->DefaultReactor();
    const int me = Index(context);
    if (me >= 0) {
      absl::MutexLock lock(&mu_);
      jobs_[me] = {};
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override {
    auto* reactor = context->DefaultReactor();
    const int me = Index(context);
    response->set_worker_name(absl::StrCat("sim-", me));
    response->set_devices(1);
    {
      absl::MutexLock lock(&mu_);
      const bool busy = me >= 0 && !jobs_[me].job.empty();
      if (busy) response->set_job_id(jobs_[me].job);
      response->set_state(busy ? v1::HealthResponse::READY : v1::HealthResponse::IDLE);
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  struct Pending {
    int worker;
    grpc::ServerUnaryReactor* reactor;
    v1::SetupResponse* response;
  };
  struct Hosted {
    std::string job;
    int rank = 0;
    int64_t global_step = 0;
  };

  int Index(grpc::CallbackServerContext* context) const {
    // The address the coordinator dialled: "127.1.x.y:port".
    const grpc::string_ref authority = context->ExperimentalGetAuthority();
    const std::string host(authority.data(), authority.size());
    auto it = index_.find(host.substr(0, host.rfind(':')));
    return it == index_.end() ? -1 : it->second;
  }

  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const v1::StepRequest* request, v1::StepResponse* response,
                                 bool training) {
    auto* reactor = context->DefaultReactor();
    const int me = Index(context);
    if (me < 0) {
      reactor->Finish(grpc::Status(grpc::INVALID_ARGUMENT, "unknown simulated worker"));
      return reactor;
    }
    int batches = 0;
    {
      absl::MutexLock lock(&mu_);
      Hosted& hosted = jobs_[me];
      for (const v1::LocalWork& work : request->work()) {
        v1::LocalResult* result = response->add_results();
        result->set_rank(hosted.rank);
        for (int b = 0; b < work.index_batches_size(); ++b, ++batches) {
          v1::BatchResult* batch = result->add_batches();
          batch->set_batch_idx(work.first_batch_idx() + b);
          batch->set_size(work.index_batches(b).indices_size());
          const double step = static_cast<double>(hosted.global_step + 1);
          (*batch->mutable_scalars())["loss"] = 2.3 / step;
          if (!training) (*batch->mutable_scalars())["acc"] = 0.9;
          if (training) {
            batch->set_optimizer_stepped(true);
            ++hosted.global_step;
          }
        }
        result->set_global_step(hosted.global_step);
        result->set_lr(0.05);
        result->set_step_seconds(absl::ToDoubleSeconds(batch_time_) * batches);
      }
    }
    timer_->At(absl::Now() + batch_time_ * batches,
               [reactor] { reactor->Finish(grpc::Status::OK); });
    return reactor;
  }

  const absl::Duration batch_time_;
  Timer* timer_;
  std::map<std::string, int> index_;  // "127.1.x.y" -> worker
  absl::Mutex mu_;
  std::vector<Hosted> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Pending>> groups_ ABSL_GUARDED_BY(mu_);
};

// ---- The simulated daemons: registration and heartbeats --------------------------------------

class Daemons {
 public:
  Daemons(const std::string& coordinator, int n, int port, SimulatedWorkers* service)
      : service_(service) {
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      // Its own connection per daemon, as separate machines have.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto channel =
          grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(v1::Workers::NewStub(channel));
    }
    port_ = port;
  }

  // Registers every daemon (a few at a time, as machines boot); returns the interval.
  absl::Status RegisterAll() {
    for (int i = 0; i < static_cast<int>(stubs_.size()); ++i) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::RegisterWorkerRequest request;
      v1::WorkerInfo* w = request.mutable_worker();
      w->set_name(absl::StrCat("sim-", i));
      w->set_address(absl::StrCat(WorkerHost(i), ":", port_));
      w->set_host(absl::StrCat("simhost-", i));
      w->set_devices(1);
      w->set_incarnation(0x5eed0000u + i);
      v1::RegisterWorkerResponse response;
      grpc::Status s = stubs_[i]->RegisterWorker(&context, request, &response);
      if (!s.ok()) {
        return absl::UnavailableError(absl::StrCat("register sim-", i, ": ", s.error_message()));
      }
      interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
    }
    return absl::OkStatus();
  }

  // Heartbeats every daemon at the interval, spread evenly over it, until Stop.
  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    stop_ = true;
    thread_.join();
    // Calls still in flight finish on gRPC's threads.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &in_flight_));
  }
  // Latencies (ms) of heartbeats sent in [from, to).
  void Window(absl::Time from, absl::Time to) {
    absl::MutexLock lock(&mu_);
    window_from_ = from;
    window_to_ = to;
  }
  std::vector<double> WindowLatencies() {
    absl::MutexLock lock(&mu_);
    return window_latencies_;
  }
  int64_t failures() {
    absl::MutexLock lock(&mu_);
    return failures_;
  }
  int64_t sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  absl::Duration interval() const { return interval_; }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::WorkerHeartbeatRequest request;
    v1::WorkerHeartbeatResponse response;
    absl::Time sent;
  };
  void Loop() {
    const int n = static_cast<int>(stubs_.size());
    const absl::Time start = absl::Now();
    for (int64_t tick = 0; !stop_; ++tick) {
      // Daemon i beats at start + (round + i / n) * interval.
      const int64_t round = tick / n;
      const int i = static_cast<int>(tick % n);
      const absl::Time due = start + interval_ * (round + static_cast<double>(i) / n);
      const absl::Duration wait = due - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
      auto call = std::make_shared<Call>();
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      call->request.set_name(absl::StrCat("sim-", i));
      call->request.set_incarnation(0x5eed0000u + i);
      call->request.set_job_id(service_->JobOf(i));
      call->sent = absl::Now();
      {
        absl::MutexLock lock(&mu_);
        ++in_flight_;
        ++sent_;
      }
      stubs_[i]->async()->WorkerHeartbeat(
          &call->context, &call->request, &call->response, [this, call](grpc::Status s) {
            const absl::Time now = absl::Now();
            absl::MutexLock lock(&mu_);
            --in_flight_;
            if (!s.ok()) {
              ++failures_;
              return;
            }
            if (call->sent >= window_from_ && call->sent < window_to_) {
              window_latencies_.push_back(absl::ToDoubleMilliseconds(now - call->sent));
            }
          });
    }
  }

  SimulatedWorkers* service_;
  std::vector<std::unique_ptr<v1::Workers::Stub>> stubs_;
  int port_ = 0;
  absl::Duration interval_ = absl::Seconds(1);
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time window_from_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time window_to_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<double> window_latencies_ ABSL_GUARDED_BY(mu_);
};

// ---- Measurements ----------------------------------------------------------------------------

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  return v[k];
}

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

// utime + stime of this process, in seconds.
double OwnCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
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
  const double cpu_before = CpuSeconds(pid), own_cpu_before = OwnCpuSeconds();
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
  const double cpu_after = CpuSeconds(pid), own_cpu_after = OwnCpuSeconds();
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

  auto median = [](std::vector<double> v) { return Percentile(std::move(v), 50); };
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
      static_cast<long long>(daemons.failures()), Percentile(latencies, 50),
      Percentile(latencies, 99), latencies.empty() ? 0.0 : worst(latencies), training, nodes,
      static_cast<long long>(steps_done), absl::ToDoubleSeconds(window),
      100 * (cpu_after - cpu_before) / absl::ToDoubleSeconds(window), rss_kib / 1024.0,
      StatusKiB(pid, "VmHWM") / 1024.0, median(list_ms), worst(list_ms), median(workers_ms),
      worst(workers_ms), queued.size(), succeeded, in_order, drain_s, Percentile(reference.ms, 50),
      Percentile(reference.ms, 99), reference.failed,
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

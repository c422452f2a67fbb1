// The simulated cluster of bench/coordinator_scale: see simulated_cluster.h.
#include "bench/simulated_cluster.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dtrain {

// ---- Deferred work ---------------------------------------------------------------------------

Timer::Timer() : thread_([this] { Loop(); }) {}

Timer::~Timer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Timer::At(absl::Time when, std::function<void()> f) {
  absl::MutexLock lock(&mu_);
  queue_.push({when, seq_++, std::move(f)});
}

void Timer::Loop() {
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

// ---- The simulated workers' Worker service ---------------------------------------------------

std::string WorkerHost(int i) { return absl::StrCat("127.1.", i / 250, ".", i % 250 + 1); }

SimulatedWorkers::SimulatedWorkers(int workers, absl::Duration batch_time, Timer* timer)
    : batch_time_(batch_time), timer_(timer), jobs_(workers) {
  for (int i = 0; i < workers; ++i) index_[WorkerHost(i)] = i;
}

std::string SimulatedWorkers::JobOf(int i) {
  absl::MutexLock lock(&mu_);
  return jobs_[i].job;
}

grpc::ServerUnaryReactor* SimulatedWorkers::Setup(grpc::CallbackServerContext* context,
                                                  const v1::SetupRequest* request,
                                                  v1::SetupResponse* response) {
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

grpc::ServerUnaryReactor* SimulatedWorkers::TrainingStep(grpc::CallbackServerContext* context,
                                                         const v1::StepRequest* request,
                                                         v1::StepResponse* response) {
  return Step(context, request, response, /*training=*/true);
}

grpc::ServerUnaryReactor* SimulatedWorkers::ValidationStep(grpc::CallbackServerContext* context,
                                                           const v1::StepRequest* request,
                                                           v1::StepResponse* response) {
  return Step(context, request, response, /*training=*/false);
}

grpc::ServerUnaryReactor* SimulatedWorkers::TestStep(grpc::CallbackServerContext* context,
                                                     const v1::StepRequest* request,
                                                     v1::StepResponse* response) {
  return Step(context, request, response, /*training=*/false);
}

grpc::ServerUnaryReactor* SimulatedWorkers::SaveCheckpoint(grpc::CallbackServerContext* context,
                                                           const v1::SaveCheckpointRequest* request,
                                                           v1::SaveCheckpointResponse* response) {
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

grpc::ServerUnaryReactor* SimulatedWorkers::ReduceBooleanDecision(
    grpc::CallbackServerContext* context, const v1::DecisionRequest* request,
    v1::DecisionResponse* response) {
  auto* reactor = context->DefaultReactor();
  // As one group would decide, for this worker's ranks.
  bool decision = request->all();
  for (bool d : request->decisions()) decision = request->all() ? decision && d : decision || d;
  response->set_decision(decision);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* SimulatedWorkers::Teardown(grpc::CallbackServerContext* context,
                                                     const v1::TeardownRequest* request,
                                                     v1::TeardownResponse* response) {
  auto* reactor = context->DefaultReactor();
  const int me = Index(context);
  if (me >= 0) {
    absl::MutexLock lock(&mu_);
    jobs_[me] = {};
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* SimulatedWorkers::Health(grpc::CallbackServerContext* context,
                                                   const v1::HealthRequest* request,
                                                   v1::HealthResponse* response) {
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

int SimulatedWorkers::Index(grpc::CallbackServerContext* context) const {
  // The address the coordinator dialled: "127.1.x.y:port".
  const grpc::string_ref authority = context->ExperimentalGetAuthority();
  const std::string host(authority.data(), authority.size());
  auto it = index_.find(host.substr(0, host.rfind(':')));
  return it == index_.end() ? -1 : it->second;
}

grpc::ServerUnaryReactor* SimulatedWorkers::Step(grpc::CallbackServerContext* context,
                                                 const v1::StepRequest* request,
                                                 v1::StepResponse* response, bool training) {
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
  timer_->At(absl::Now() + batch_time_ * batches, [reactor] { reactor->Finish(grpc::Status::OK); });
  return reactor;
}

// ---- The simulated daemons: registration and heartbeats --------------------------------------

Daemons::Daemons(const std::string& coordinator, int n, int port, SimulatedWorkers* service)
    : service_(service), port_(port) {
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    // Its own connection per daemon, as separate machines have.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), args);
    stubs_.push_back(v1::Workers::NewStub(channel));
  }
}

absl::Status Daemons::RegisterAll() {
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

void Daemons::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Daemons::Stop() {
  stop_ = true;
  thread_.join();
  // Calls still in flight finish on gRPC's threads.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &in_flight_));
}

void Daemons::Window(absl::Time from, absl::Time to) {
  absl::MutexLock lock(&mu_);
  window_from_ = from;
  window_to_ = to;
}

std::vector<double> Daemons::WindowLatencies() {
  absl::MutexLock lock(&mu_);
  return window_latencies_;
}

int64_t Daemons::failures() {
  absl::MutexLock lock(&mu_);
  return failures_;
}

int64_t Daemons::sent() {
  absl::MutexLock lock(&mu_);
  return sent_;
}

void Daemons::Loop() {
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

}  // namespace dtrain

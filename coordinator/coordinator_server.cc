#include "coordinator/coordinator_server.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/directories.h"
#include "common/log.h"
#include "common/standard_services.h"
#include "common/streaming.h"
#include "common/unparsable_request.h"

namespace dtrain {
namespace {

std::string HostName() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
}

std::vector<std::string> Services() {
  return {v1::Coordinator::service_full_name(), v1::Workers::service_full_name(),
          v1::Jobs::service_full_name()};
}

}  // namespace

CoordinatorServer::CoordinatorServer(CoordinatorOptions options) : options_(std::move(options)) {
  access_ = std::make_unique<AccessControl>(options_.admin_token);
  kv_ = std::make_unique<KeyValueStore>();
  GroupEvents events;
  events.failed = [this](const std::string& group, int64_t generation, const absl::Status& reason) {
    engine_->FailGroup(group, generation, reason);
  };
  events.member_left = [this](const std::string& group, int64_t generation, int rank,
                              const std::string& who) {
    engine_->MemberLeft(group, generation, rank, who);
  };
  events.ended = [this](const std::string& group, int64_t generation) {
    engine_->DropGroup(group, generation);
    kv_->DeleteScope(group);
    // Large payload buffers of the finished group go back to the system, not to a cache.
    malloc_trim(0);
  };
  groups_ = std::make_unique<GroupTable>(options_.groups, std::move(events));
  engine_ = std::make_unique<CollectiveEngine>(groups_.get());
  workers_ = std::make_unique<WorkerRegistry>(options_.groups.heartbeat_timeout,
                                              options_.groups.heartbeat_interval,
                                              options_.max_worker_heartbeats_per_second);
  service_ =
      std::make_unique<CoordinatorService>(groups_.get(), engine_.get(), kv_.get(), access_.get());
  workers_service_ = std::make_unique<WorkersService>(workers_.get(), access_.get());
  retired_methods_ = std::make_unique<RetiredMethods>(WorkerMethodsMovedToWorkersService());
  JobManagerOptions jobs;
  jobs.state_dir = options_.state_dir;
  jobs.host = HostName();
  jobs.setup_timeout = options_.job_setup_timeout;
  jobs.step_timeout = options_.job_step_timeout;
  jobs_ = std::make_unique<JobManager>(jobs, workers_.get(), access_.get());
  jobs_service_ = std::make_unique<JobsService>(jobs_.get(), access_.get());
  DescribeMetrics();
}

void CoordinatorServer::DescribeMetrics() {
  metrics_ = std::make_unique<MetricsRegistry>();
  MetricsRegistry* m = metrics_.get();
  m->DescribeCounter("dtrain_collectives_total", "Collectives completed, by kind and outcome.");
  m->DescribeCounter("dtrain_collective_bytes_total",
                     "Payload bytes the ranks sent into completed collectives, by kind.");
  m->DescribeHistogram("dtrain_collective_latency_seconds",
                       "From a collective's first rank arriving to its result, by kind.",
                       LatencyBuckets());
  engine_->SetObserver(
      [m](CollectiveKind kind, int64_t bytes, absl::Duration latency, const absl::Status& outcome) {
        const std::string name = CollectiveKindName(kind);
        m->Increment("dtrain_collectives_total",
                     {{"kind", name}, {"outcome", outcome.ok() ? "ok" : "error"}});
        m->Increment("dtrain_collective_bytes_total", {{"kind", name}}, static_cast<double>(bytes));
        m->Observe("dtrain_collective_latency_seconds", {{"kind", name}},
                   absl::ToDoubleSeconds(latency));
      });
  m->AddGauge("dtrain_jobs", "Jobs the coordinator knows, by state.", [this](const auto& emit) {
    // Counted, not copied: a scrape does not copy a history of thousands of jobs.
    JobCounts counts = jobs_->Count();
    for (v1::JobState s : {v1::QUEUED, v1::RUNNING, v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
      emit({{"state", v1::JobState_Name(s)}}, static_cast<double>(counts.by_state[s]));
    }
  });
  m->AddGauge("dtrain_workers", "Registered workers, by state.", [this](const auto& emit) {
    std::map<std::string, int> count;
    for (const v1::WorkerInfo& w : workers_->List(absl::Now())) {
      ++count[v1::WorkerInfo::State_Name(w.state())];
    }
    for (const auto& [state, n] : count) emit({{"state", state}}, n);
  });
  m->AddGauge("dtrain_groups", "Process groups in the table, by state.", [this](const auto& emit) {
    for (const auto& [state, n] : groups_->CountByState()) {
      emit({{"state", v1::GroupState_Name(state)}}, n);
    }
  });
  m->AddGauge("dtrain_artifact_bytes", "Bytes of uploaded files the coordinator stores.",
              [this](const auto& emit) {
                if (artifacts_ != nullptr)
                  emit({}, static_cast<double>(artifacts_->stored_bytes()));
              });
  m->AddGauge(
      "dtrain_heartbeat_deaths_total", "Group members declared dead for missing heartbeats.",
      [this](const auto& emit) { emit({}, static_cast<double>(groups_->heartbeat_deaths())); },
      "counter");
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorOptions options) {
  if (options.state_dir.empty()) options.state_dir = DefaultStateDirectory() + "/coordinator";
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer(std::move(options)));
  auto artifacts = ArtifactStore::Open({server->options_.state_dir + "/artifacts",
                                        server->options_.max_artifact_bytes,
                                        server->options_.artifact_quota_bytes});
  if (!artifacts.ok()) return artifacts.status();
  server->artifacts_ = std::move(*artifacts);
  server->jobs_->SetArtifactStore(server->artifacts_.get());
  if (!server->options_.database.empty()) {
    if (absl::Status s = server->jobs_->Restore(server->options_.database); !s.ok()) return s;
  }
  JobManager* jobs = server->jobs_.get();
  server->artifacts_service_ = std::make_unique<ArtifactsService>(
      server->artifacts_.get(), server->access_.get(),
      [jobs](const std::string& group, const std::string& digest) {
        return jobs->GroupMayRead(group, digest);
      });
  EnableStandardServices();
  grpc::ServerBuilder builder;
  AcceptClientKeepalive(builder);
  ListenExclusively(builder);
  builder.AddListeningPort(server->options_.listen_address,
                           server->options_.credentials != nullptr
                               ? server->options_.credentials
                               : grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->workers_service_.get());
  builder.RegisterService(server->jobs_service_.get());
  builder.RegisterService(server->artifacts_service_.get());
  builder.RegisterCallbackGenericService(server->retired_methods_.get());
  AnswerUnparsableRequests(builder);
  builder.SetMaxReceiveMessageSize(kCoordinatorMaxReceiveBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  grpc::ResourceQuota quota("dtrain-coordinator");
  quota.Resize(static_cast<size_t>(kCoordinatorMemoryQuotaBytes));
  builder.SetResourceQuota(quota);
  // Each connection keeps a read buffer sized to its traffic; uncapped, 64 idle ranks that
  // once moved megabytes pin ~3 MiB each. 256 KiB keeps loopback throughput and bounds that.
  builder.AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 256 * 1024);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", server->options_.listen_address,
                                               ": the address is invalid or already in use"));
  }
  if (!server->options_.metrics_listen.empty()) {
    auto http = MetricsHttpServer::Start(server->options_.metrics_listen, server->metrics_.get());
    if (!http.ok()) return http.status();
    server->metrics_http_ = std::move(*http);
  }
  if (!server->options_.http_listen.empty()) {
    WebServerOptions web;
    web.listen = server->options_.http_listen;
    web.admin_token = server->options_.admin_token;
    web.insecure = server->options_.http_insecure;
    web.tls = server->options_.http_tls;
    web.allowed_hosts = server->options_.http_allowed_hosts;
    const std::string& advertise = server->options_.advertise_address;
    web.advertised_host = advertise.substr(0, advertise.rfind(':'));
    auto started = WebServer::Start(web, {server->jobs_.get(), server->workers_.get(),
                                          server->groups_.get(), server->artifacts_.get()});
    if (!started.ok()) return started.status();
    server->web_ = std::move(*started);
  }
  SetServing(server->server_.get(), Services(), true);
  const std::string& address = server->options_.listen_address;
  server->host_ = address.substr(0, address.rfind(':'));
  std::string advertise = server->options_.advertise_address;
  if (advertise.empty()) {
    std::string host = server->host_;
    if (host.empty() || host == "0.0.0.0" || host == "[::]") host = HostName();
    advertise = absl::StrCat(host, ":", server->port_);
  } else if (absl::EndsWith(advertise, ":0")) {
    // A host with the port this server got (listening on port 0).
    advertise = absl::StrCat(advertise.substr(0, advertise.size() - 1), server->port_);
  }
  server->jobs_->SetCoordinatorAddress(advertise);
  server->monitor_ = std::thread([s = server.get()] { s->MonitorLoop(); });
  return server;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

std::string CoordinatorServer::address() const { return absl::StrCat(host_, ":", port_); }

void CoordinatorServer::MonitorLoop() {
  // Freed payload and transport buffers go back to the system once traffic pauses, instead of
  // lingering in malloc's free lists: a long-lived service's memory must follow its load.
  constexpr absl::Duration kQuiet = absl::Milliseconds(200);
  // The tick is the precision of the deadlines of waiting calls (collectives, key-value gets,
  // registrations of a forming group) and the scheduler's delay. With none of them waiting, as
  // while a job trains on the shared-memory plane, only heartbeats are due, whose timeouts are
  // seconds: the monitor then wakes 10 times a second, not 50, since every wake-up on a core a
  // synchronous job trains on costs the job more than its own CPU time (docs/BENCHMARKS.md).
  constexpr absl::Duration kIdleTick = absl::Milliseconds(100);
  const absl::Duration idle_tick = std::max(options_.tick, kIdleTick);
  uint64_t seen_calls = engine_->SubmittedCount();
  absl::Time last_activity = absl::Now();
  bool trimmed = true;
  absl::Duration wait = options_.tick;
  while (!stop_monitor_.WaitForNotificationWithTimeout(wait)) {
    const absl::Time now = absl::Now();
    // Each component says whether something of its own still waits on a deadline.
    bool waiting = groups_->Tick(now);
    waiting = engine_->Tick(now) || waiting;
    waiting = kv_->Tick(now) || waiting;
    jobs_->WorkersLost(workers_->Tick(now));
    jobs_->Schedule();
    const uint64_t calls = engine_->SubmittedCount();
    if (calls != seen_calls) {
      seen_calls = calls;
      last_activity = now;
      trimmed = false;
    } else if (!trimmed && now - last_activity >= kQuiet) {
      malloc_trim(0);
      trimmed = true;
    }
    wait = waiting || jobs_->Waiting() || !trimmed ? options_.tick : idle_tick;
  }
}

void CoordinatorServer::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Load balancers and probes stop sending new work first; the dashboard's streams end.
  if (server_ != nullptr) SetServing(server_.get(), Services(), false);
  web_.reset();
  stop_monitor_.Notify();
  if (monitor_.joinable()) monitor_.join();
  // Running jobs are cancelled first: their workers are torn down while the groups still work.
  jobs_->Shutdown();
  // Answer every waiting call before the server stops accepting, so nothing hangs.
  groups_->Stop();
  engine_->Stop();
  kv_->Stop();
  // Members on the Gloo and shared-memory planes learn of the shutdown from their next
  // heartbeat's answer; once the server stops they would hear only UNAVAILABLE, which they wait
  // out for the heartbeat timeout. So the server answers for two more heartbeat rounds and a
  // second of slack for a loaded host (CI has held a healthy rank's heartbeats up for 1.1 s), at
  // most 5 s, less when every member has heard (a coordinator without active groups stops at
  // once).
  const absl::Duration window =
      std::min(options_.groups.heartbeat_interval * 2 + absl::Seconds(1), absl::Seconds(5));
  if (int not_told = groups_->AwaitMembersTold(window); not_told > 0) {
    LogWarning(
        "group members sent no heartbeat during the shutdown (gone, or slow): a live one sees the "
        "coordinator as gone only after its heartbeat timeout",
        {{"members", not_told}, {"waited_ms", absl::ToInt64Milliseconds(window)}});
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
}

}  // namespace dtrain

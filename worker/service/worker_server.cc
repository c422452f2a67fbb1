#include "worker/service/worker_server.h"

#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/artifacts_client.h"
#include "common/channel.h"
#include "common/directories.h"
#include "common/log.h"
#include "common/metrics_http_server.h"
#include "common/metrics_registry.h"
#include "common/port_file.h"
#include "common/standard_services.h"
#include "common/streaming.h"
#include "common/unparsable_request.h"
#include "worker/plugins/plugin_registry.h"
#include "worker/precision/device_plan.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/cpu_placement.h"
#include "worker/service/artifact_cache.h"
#include "worker/service/worker_registration.h"
#include "worker/service/worker_service.h"

namespace dtrain {
namespace {

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name)) != 0) return "localhost";
  return name;
}

std::vector<std::string> Services() { return {v1::Worker::service_full_name()}; }

void WritePortFileOrWarn(const std::string& file, int port) {
  if (absl::Status s = WritePortFile(file, port); !s.ok()) LogWarning(s.message());
}

}  // namespace

WorkerServer::WorkerServer(WorkerServerOptions options) : options_(std::move(options)) {}

WorkerServer::~WorkerServer() { Stop().IgnoreError(); }

int WorkerServer::metrics_port() const {
  return metrics_http_ != nullptr ? metrics_http_->port() : 0;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(WorkerServerOptions options) {
  std::unique_ptr<WorkerServer> server(new WorkerServer(std::move(options)));
  WorkerServerOptions& o = server->options_;
  const std::string& listen = o.listen_address;
  WorkerIdentity& identity = o.identity;
  // The CUDA devices libtorch sees, else 1 (the CPU).
  if (identity.devices == 0) identity.devices = AutoDeviceCount(DeviceTable::Detect());
  if (identity.host.empty()) identity.host = HostName();
  const size_t colon = listen.rfind(':');
  const std::string listen_port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  if (identity.name.empty()) {
    identity.name = listen_port == "0" || listen_port.empty()
                        ? absl::StrCat(identity.host, "-", getpid())
                        : absl::StrCat(identity.host, ":", listen_port);
  }
  WorkerServiceOptions service;
  service.identity = identity;
  service.allowed_cpus = o.allowed_cpus;
  service.spawn_binary = o.spawn_binary;
  service.isolate_ranks = o.isolate_ranks && !o.child;
  if (service.isolate_ranks && o.spawn_binary.empty()) {
    return absl::InvalidArgumentError("rank isolation needs the worker's binary to spawn");
  }
  service.token = o.token;
  server->metrics_ = std::make_unique<MetricsRegistry>();
  MetricsRegistry& metrics = *server->metrics_;
  metrics.DescribeCounter("dtrain_worker_step_calls_total", "Step RPCs run, by kind and outcome.");
  metrics.DescribeCounter("dtrain_worker_batches_total",
                          "Batches those step RPCs carried, by kind.");
  metrics.DescribeHistogram("dtrain_worker_step_call_seconds", "Time of one step RPC, by kind.",
                            LatencyBuckets());
  service.metrics = &metrics;
  // A coordinator that restarts is waited for, within each call's deadline.
  server->artifacts_client_ = std::make_unique<ArtifactsClient>(
      ConnectToCoordinator(identity.coordinator), absl::Seconds(60),
      /*wait_for_ready=*/true);
  ArtifactsClient* client = server->artifacts_client_.get();
  const std::string safe_name = absl::StrReplaceAll(identity.name, {{"/", "_"}});
  // A rank child has a cache of its own, <daemon's>/child-<i>, which its daemon passes: a
  // cache directory belongs to one process (ArtifactCache evicts without asking others).
  if (o.cache_dir.empty()) o.cache_dir = DefaultCacheDirectory() + "/worker/" + safe_name;
  // A rank child's cache is its own, inside its daemon's, with the same bound.
  service.identity.cache_dir = o.cache_dir;
  service.identity.cache_bytes = o.cache_bytes;
  server->artifacts_ = std::make_unique<ArtifactCache>(
      o.cache_dir, o.cache_bytes, [client](const std::string& digest, const std::string& path) {
        return client->Fetch(digest, path);
      });
  ArtifactCache* cache = server->artifacts_.get();
  // Streamed shards go through it one by one, in children too.
  service.identity.fetch_artifact = [cache](const std::string& digest) {
    return cache->Get(digest);
  };
  // ddp_spawn children read the other files their daemon resolved; only the daemon keeps them.
  if (!o.child) {
    service.artifacts = cache;
    if (o.jobs_dir.empty()) o.jobs_dir = DefaultStateDirectory() + "/worker-jobs/" + safe_name;
    service.jobs_dir = o.jobs_dir;
    service.store_file = [client](const std::string& path) -> absl::StatusOr<std::string> {
      absl::StatusOr<UploadResult> sent = client->Upload(path);
      if (!sent.ok()) return sent.status();
      return sent->digest;
    };
  }
  server->service_ = std::make_unique<WorkerService>(std::move(service));
  server->DescribeMetrics();
  if (!o.metrics_listen.empty()) {
    auto http = MetricsHttpServer::Start(o.metrics_listen, &metrics);
    if (!http.ok()) return absl::FailedPreconditionError(http.status().message());
    server->metrics_http_ = std::move(*http);
    LogInfo("metrics served", {{"port", server->metrics_http_->port()}, {"path", "/metrics"}});
  }
  EnableStandardServices();
  grpc::ServerBuilder builder;
  AcceptClientKeepalive(builder);
  ListenExclusively(builder);
  builder.AddListeningPort(
      listen, o.credentials != nullptr ? o.credentials : grpc::InsecureServerCredentials(),
      &server->port_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  grpc::ResourceQuota quota("dtrain-worker");
  quota.Resize(static_cast<size_t>(kWorkerMemoryQuotaBytes));
  builder.SetResourceQuota(quota);
  builder.RegisterService(server->service_.get());
  AnswerUnparsableRequests(builder);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (in use, or not an address here)"));
  }
  SetServing(server->server_.get(), Services(), true);
  LogInfo(o.child ? "serving (ddp_spawn child)" : "serving",
          {{"worker", identity.name}, {"port", server->port_}, {"devices", identity.devices}});
  if (server->metrics_http_ != nullptr) {
    WritePortFileOrWarn(o.metrics_port_file, server->metrics_http_->port());
  }
  WritePortFileOrWarn(o.port_file, server->port_);
  if (!o.child) server->Register();
  return server;
}

void WorkerServer::DescribeMetrics() {
  WorkerService* s = service_.get();
  metrics_->AddGauge("dtrain_worker_job", "1 while a job is set up on this worker.",
                     [s](const auto& emit) {
                       const std::string job = s->current_job();
                       emit({{"job", job}}, job.empty() ? 0 : 1);
                     });
  if (artifacts_ != nullptr) {
    ArtifactCache* cache = artifacts_.get();
    metrics_->AddGauge(
        "dtrain_worker_artifact_cache_hits_total",
        "Uploaded files a job named that this worker already had.",
        [cache](const auto& emit) { emit({}, static_cast<double>(cache->hits())); }, "counter");
    metrics_->AddGauge(
        "dtrain_worker_artifact_cache_misses_total",
        "Uploaded files this worker fetched from the coordinator.",
        [cache](const auto& emit) { emit({}, static_cast<double>(cache->misses())); }, "counter");
    metrics_->AddGauge(
        "dtrain_worker_artifact_cache_tampered_total",
        "Cached files found changed since they were verified, removed and fetched again.",
        [cache](const auto& emit) { emit({}, static_cast<double>(cache->tampered())); }, "counter");
    metrics_->AddGauge(
        "dtrain_worker_artifact_cache_bytes", "Bytes in this worker's file cache.",
        [cache](const auto& emit) { emit({}, static_cast<double>(cache->bytes())); });
  }
}

void WorkerServer::Register() {
  const std::string& listen = options_.listen_address;
  const WorkerIdentity& identity = options_.identity;
  std::string advertise = options_.advertise_address;
  if (advertise.empty()) {
    const size_t colon = listen.rfind(':');
    std::string listen_host = colon == std::string::npos ? "" : listen.substr(0, colon);
    // The machine's network name, even when --host names it otherwise for the rendezvous.
    if (listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "[::]") {
      listen_host = HostName();
    }
    advertise = absl::StrCat(listen_host, ":", port_);
  }
  v1::WorkerInfo self;
  self.set_name(identity.name);
  self.set_address(advertise);
  self.set_host(identity.host);
  self.set_devices(identity.devices);
  // What this worker offers beyond dtrain's own, for the coordinator's checks and placement.
  for (const PluginInfo& p : PluginRegistry::Global().Loaded()) {
    v1::Plugin* offered = self.add_plugins();
    offered->set_kind(PluginKindName(p.kind));
    offered->set_name(p.name);
    offered->set_description(p.description);
  }
  std::random_device random;
  uint64_t incarnation = 0;
  while (incarnation == 0) incarnation = (uint64_t{random()} << 32) | random();
  self.set_incarnation(incarnation);
  self.set_allowed_cpus(FormatCpuList(options_.allowed_cpus));
  self.set_cpus_auto(options_.place_cpus);
  WorkerService* s = service_.get();
  WorkerRegistration::Hooks hooks;
  hooks.current_job = [s] { return s->current_job(); };
  hooks.abandon_job = [s](const std::string& job) { s->AbandonJob(job); };
  hooks.placement = [s] { return s->placement(); };
  if (options_.place_cpus) {
    hooks.same_host = [s, name = identity.name, allowed = options_.allowed_cpus,
                       threads = options_.threads_flag, quota = options_.quota_cores](
                          const google::protobuf::RepeatedPtrField<v1::WorkerInfo>& peers) {
      std::vector<LocalWorker> others;
      for (const v1::WorkerInfo& peer : peers) {
        // A list that does not parse (a newer or broken peer) counts as not meeting ours.
        absl::StatusOr<std::vector<int>> peer_allowed = ParseCpuList(peer.allowed_cpus());
        absl::StatusOr<std::vector<int>> pinned = ParseCpuList(peer.cpus());
        if (!peer_allowed.ok() || peer_allowed->empty()) continue;
        others.push_back({.name = peer.name(),
                          .allowed = *std::move(peer_allowed),
                          .pinned = pinned.ok() ? *std::move(pinned) : std::vector<int>{},
                          .automatic = peer.cpus_auto()});
      }
      s->OfferPlacement(PlaceSteps(name, allowed, threads, others, quota));
    };
  }
  registration_ = std::make_unique<WorkerRegistration>(identity.coordinator, self, hooks);
}

void WorkerServer::Drain(const std::string& signal,
                         const std::function<bool(absl::Duration wait)>& interrupted) {
  SetServing(server_.get(), Services(), false);
  WorkerService& service = *service_;
  service.Drain();
  const std::string job = service.current_job();
  const absl::Duration timeout = options_.drain_timeout;
  const absl::Time deadline = absl::Now() + timeout;
  bool hold = false;
  if (registration_ != nullptr) hold = registration_->ReportDraining();
  if (job.empty()) {
    LogInfo("stopping: no job here", {{"signal", signal}});
  } else {
    LogInfo(hold ? "stopping: waiting for the coordinator to checkpoint the job and let "
                   "this worker go"
                 : "stopping: finishing the current step, then leaving the job's group",
            {{"signal", signal}, {"job", job}, {"drain_timeout", absl::FormatDuration(timeout)}});
  }
  // Polled, so that a second signal or the coordinator changing its answer is seen at once.
  while (!job.empty()) {
    const bool done = hold && registration_->release_pending() ? service.current_job().empty()
                                                               : service.WaitUntilIdle(absl::Now());
    if (done) break;
    if (absl::Now() >= deadline) {
      LogWarning("drain timeout: stopping the job's step now", {{"job", job}});
      break;
    }
    if (interrupted(absl::Milliseconds(100))) {
      LogWarning("second signal: stopping the job's step now", {{"job", job}});
      break;
    }
  }
  // Stop reports the outcome.
  service.StopNow().IgnoreError();
}

absl::Status WorkerServer::Stop() {
  if (stopped_) return stop_status_;
  stopped_ = true;
  if (server_ != nullptr) SetServing(server_.get(), Services(), false);
  if (service_ != nullptr) {
    if (absl::Status s = service_->StopNow(); !s.ok()) {
      stop_status_ = s;
      // The executor still runs the stuck call, which uses the service and the server: leak
      // them on purpose (the process exits next) rather than wait in their destructors.
      (void)service_.release();
      (void)server_.release();
      (void)registration_.release();
      (void)metrics_http_.release();
      return s;
    }
  }
  registration_.reset();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  metrics_http_.reset();  // its collector reads the service
  server_.reset();
  service_.reset();
  return absl::OkStatus();
}

}  // namespace dtrain

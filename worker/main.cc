// dtrain-worker: the worker daemon. Serves the Worker service (one job at a time), registers
// with the coordinator and heartbeats, and on SIGTERM or SIGINT drains: takes no new job, lets
// the running step finish (or its coordinator checkpoint the job), leaves the job's group
// cleanly, unregisters and exits.
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/artifacts_client.h"
#include "common/channel.h"
#include "common/command_line.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/log_flags.h"
#include "common/metrics_http_server.h"
#include "common/metrics_registry.h"
#include "common/process_tuning.h"
#include "common/standard_services.h"
#include "common/streaming.h"
#include "common/termination_signals.h"
#include "common/tls_flags.h"
#include "common/token_flags.h"
#include "worker/plugins/plugin_registry.h"
#include "worker/precision/device_plan.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/service/artifact_cache.h"
#include "worker/service/worker_registration.h"
#include "worker/service/worker_service.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus metrics over HTTP (/metrics); empty: none");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:29610", "the coordinator's host:port");
ABSL_FLAG(std::string, listen, "127.0.0.1:29611",
          "host:port to serve the Worker service on; port 0 picks a free port (--port_file)");
ABSL_FLAG(std::string, devices, "1",
          "local devices (ranks under ddp_spawn, replicas under dp): a number, or auto (the "
          "CUDA devices, else 1 on a CPU)");
ABSL_FLAG(std::string, name, "",
          "the worker's unique name; default <host>:<port>, or <host>-<pid> for port 0");
ABSL_FLAG(std::string, advertise, "",
          "host:port the coordinator should use to reach this worker; default: --listen, with "
          "this host's name for a wildcard host");
ABSL_FLAG(std::string, port_file, "", "if set, the bound port is written here once serving");
ABSL_FLAG(int, threads, 0,
          "libtorch compute threads (0: one per core); with several workers on one machine, "
          "give each its share of the cores");
ABSL_FLAG(std::string, cpus, "",
          "pin the step thread (and its compute threads) to these cores, in taskset's list "
          "syntax (0-3,6); with several workers on one machine give each its own (empty: not "
          "pinned; --threads 0 then means one per listed core); ddp_spawn's children split them");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(60),
          "on SIGTERM, how long the running step may finish, or the coordinator may checkpoint "
          "the job, before the step is stopped; a second SIGTERM stops it at once");
ABSL_FLAG(std::string, cache_dir, "",
          "where files jobs name by content (uploaded with their spec) are kept between jobs; "
          "default /tmp/dtrain-worker-cache/<name>");
ABSL_FLAG(int64_t, cache_bytes, int64_t{20} << 30,
          "the cache's size bound; the least recently used files go first; 0: no bound");
ABSL_FLAG(std::string, jobs_dir, "",
          "where this worker writes a job's checkpoints before sending them to the coordinator "
          "(removed when the job leaves); default /tmp/dtrain-worker-jobs/<name>");
ABSL_FLAG(bool, child, false, "internal: a ddp_spawn child (no registration, no ddp_spawn)");
ABSL_FLAG(std::vector<std::string>, plugin, {},
          "shared libraries of plugins (strategies, precision plugins, accelerators, checkpoint "
          "IO) to load at startup, comma-separated or repeated; see docs/extending.md");

namespace {

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name)) != 0) return "localhost";
  return name;
}

std::string SelfBinary() {
  char path[PATH_MAX + 1] = {};
  const ssize_t n = readlink("/proc/self/exe", path, PATH_MAX);
  return n > 0 ? std::string(path, n) : "";
}

int ParseDevices(const std::string& flag) {
  // The CUDA devices libtorch sees, else 1 (the CPU).
  if (flag == "auto") return dtrain::AutoDeviceCount(dtrain::DeviceTable::Detect());
  int n = 0;
  if (!absl::SimpleAtoi(flag, &n) || !dtrain::kDevicesRange.Contains(n)) return -1;
  return n;
}

// SIGTERM's graceful part: no new job; the running step finishes; a job the coordinator runs
// is checkpointed and lets this worker go (it resumes elsewhere). Bounded by `timeout`; a
// second signal cuts it short. The hard part (stop the step, leave the group) is StopNow's.
void StopGracefully(dtrain::WorkerService& service, dtrain::WorkerRegistration* registration,
                    const sigset_t& signals, int received, absl::Duration timeout) {
  service.Drain();
  const std::string job = service.current_job();
  const absl::Time deadline = absl::Now() + timeout;
  bool hold = false;
  if (registration != nullptr) hold = registration->ReportDraining();
  if (job.empty()) {
    dtrain::LogInfo("stopping: no job here", {{"signal", strsignal(received)}});
  } else {
    dtrain::LogInfo(hold ? "stopping: waiting for the coordinator to checkpoint the job and let "
                           "this worker go"
                         : "stopping: finishing the current step, then leaving the job's group",
                    {{"signal", strsignal(received)},
                     {"job", job},
                     {"drain_timeout", absl::FormatDuration(timeout)}});
  }
  // Polled, so that a second signal or the coordinator changing its answer is seen at once.
  while (!job.empty()) {
    const bool done = hold && registration->release_pending() ? service.current_job().empty()
                                                              : service.WaitUntilIdle(absl::Now());
    if (done) break;
    if (absl::Now() >= deadline) {
      dtrain::LogWarning("drain timeout: stopping the job's step now", {{"job", job}});
      break;
    }
    const timespec poll = {0, 100 * 1000 * 1000};
    if (sigtimedwait(&signals, nullptr, &poll) > 0) {
      dtrain::LogWarning("second signal: stopping the job's step now", {{"job", job}});
      break;
    }
  }
  service.StopNow();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dtrain-worker: hosts an Accelerator and runs a job's steps for the coordinator.\n"
      "Usage: dtrain-worker [--coordinator=127.0.0.1:29610] [--listen=127.0.0.1:29611] "
      "[--devices=N|auto] [--name=NAME] [--tls_cert=F --tls_key=F] [--tls_ca=F] "
      "[--tls_require_client_cert] [--token_file=F] [--insecure]");
  const dtrain::CommandLine command_line = dtrain::ParseFlagsOrExit(argc, argv, "dtrain-worker");
  if (!command_line.positional.empty()) {
    std::fprintf(stderr, "dtrain-worker: unexpected argument '%s'; --help lists every flag\n",
                 command_line.positional[0].c_str());
    return 2;
  }
  dtrain::TuneProcessForDtrain();
  if (absl::Status s = dtrain::ConfigureLoggingFromFlags("dtrain-worker"); !s.ok()) {
    dtrain::LogError(s.message());
    return 2;
  }

  const sigset_t signals = dtrain::BlockTerminationSignals();

  const int devices = ParseDevices(absl::GetFlag(FLAGS_devices));
  if (devices < 0) {
    dtrain::LogError(absl::StrCat("--devices must be a number in [", dtrain::kDevicesRange.low,
                                  ", ", dtrain::kDevicesRange.high, "] or auto, got '",
                                  absl::GetFlag(FLAGS_devices), "'"));
    return 2;
  }
  const bool child = absl::GetFlag(FLAGS_child);
  // Plugins first: a library that cannot load stops the daemon before it takes a job.
  std::vector<std::string> plugins;
  for (const std::string& path : absl::GetFlag(FLAGS_plugin)) {
    if (path.empty()) continue;
    absl::Status loaded = dtrain::PluginRegistry::Global().LoadLibrary(path);
    if (!loaded.ok()) {
      dtrain::LogError(std::string(loaded.message()));
      return 2;
    }
    plugins.push_back(path);
  }
  for (const dtrain::PluginInfo& p : dtrain::PluginRegistry::Global().Loaded()) {
    dtrain::LogInfo(
        "plugin loaded",
        {{"kind", dtrain::PluginKindName(p.kind)}, {"name", p.name}, {"library", p.origin}});
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    dtrain::LogError("--threads must be >= 0");
    return 2;
  }
  int threads = absl::GetFlag(FLAGS_threads);
  std::vector<int> cpus;
  if (const std::string list = absl::GetFlag(FLAGS_cpus); !list.empty()) {
    absl::StatusOr<std::vector<int>> checked = dtrain::CheckCpuList(list);
    if (!checked.ok()) {
      dtrain::LogError(absl::StrCat("--cpus: ", checked.status().message()));
      return 2;
    }
    cpus = *std::move(checked);
    if (threads == 0) threads = static_cast<int>(cpus.size());
    if (threads > static_cast<int>(cpus.size())) {
      dtrain::LogError(absl::StrCat("--threads=", threads, " is more than the ", cpus.size(),
                                    " core(s) of --cpus=", list,
                                    "; the threads would share cores: list more cores or "
                                    "lower --threads"));
      return 2;
    }
    dtrain::LogInfo("steps pinned",
                    {{"cpus", dtrain::FormatCpuList(cpus)}, {"threads", absl::StrCat(threads)}});
  }
  dtrain::SetComputeThreads(threads);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const std::string host = HostName();

  dtrain::WorkerServiceOptions options;
  options.identity.host = host;
  options.identity.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.identity.devices = devices;
  options.identity.threads = threads;
  options.identity.cpus = cpus;
  options.identity.plugins = plugins;
  options.spawn_binary = child ? "" : SelfBinary();
  const size_t colon = listen.rfind(':');
  const std::string listen_port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  options.identity.name = absl::GetFlag(FLAGS_name);
  if (options.identity.name.empty()) {
    options.identity.name = listen_port == "0" || listen_port.empty()
                                ? absl::StrCat(host, "-", getpid())
                                : absl::StrCat(host, ":", listen_port);
  }

  // ddp_spawn children listen on 127.0.0.1 only and are reached by their parent alone.
  auto credentials = dtrain::ServerCredentialsFor(listen, dtrain::TlsFilesFromFlags(),
                                                  !child && dtrain::RequireClientCertFromFlags(),
                                                  dtrain::InsecureFromFlags());
  if (!credentials.ok()) {
    dtrain::LogError(credentials.status().message());
    return 2;
  }
  if (child) credentials = grpc::InsecureServerCredentials();
  // The worker is a client of its coordinator (and a ddp_spawn parent's children inherit it).
  if (absl::Status s = dtrain::ConfigureClientTlsFromFlags(); !s.ok()) {
    dtrain::LogError(s.message());
    return 2;
  }
  // One token both ways: presented to the coordinator, and required of whoever calls this
  // worker (the coordinator; a ddp_spawn child's parent, whose token it inherited).
  absl::StatusOr<std::string> token = dtrain::ConfigureServerTokenFromFlags(listen);
  if (!token.ok()) {
    dtrain::LogError(token.status().message());
    return 2;
  }
  options.token = *token;
  dtrain::MetricsRegistry metrics;
  metrics.DescribeCounter("dtrain_worker_step_calls_total", "Step RPCs run, by kind and outcome.");
  metrics.DescribeCounter("dtrain_worker_batches_total",
                          "Batches those step RPCs carried, by kind.");
  metrics.DescribeHistogram("dtrain_worker_step_call_seconds", "Time of one step RPC, by kind.",
                            dtrain::LatencyBuckets());
  options.metrics = &metrics;
  // ddp_spawn children read the files their daemon resolved; only the daemon fetches.
  std::unique_ptr<dtrain::ArtifactsClient> artifacts_client;
  std::unique_ptr<dtrain::ArtifactCache> artifacts;
  if (!child) {
    // A coordinator that restarts is waited for, within each call's deadline.
    artifacts_client = std::make_unique<dtrain::ArtifactsClient>(
        dtrain::ConnectToCoordinator(options.identity.coordinator), absl::Seconds(60),
        /*wait_for_ready=*/true);
    std::string cache_dir = absl::GetFlag(FLAGS_cache_dir);
    if (cache_dir.empty()) {
      cache_dir = absl::StrCat("/tmp/dtrain-worker-cache/",
                               absl::StrReplaceAll(options.identity.name, {{"/", "_"}}));
    }
    artifacts = std::make_unique<dtrain::ArtifactCache>(
        cache_dir, absl::GetFlag(FLAGS_cache_bytes),
        [client = artifacts_client.get()](const std::string& digest, const std::string& path) {
          return client->Fetch(digest, path);
        });
    options.artifacts = artifacts.get();
    const std::string safe_name = absl::StrReplaceAll(options.identity.name, {{"/", "_"}});
    options.jobs_dir = absl::GetFlag(FLAGS_jobs_dir);
    if (options.jobs_dir.empty()) options.jobs_dir = "/tmp/dtrain-worker-jobs/" + safe_name;
    options.store_file =
        [client = artifacts_client.get()](const std::string& path) -> absl::StatusOr<std::string> {
      absl::StatusOr<dtrain::UploadResult> sent = client->Upload(path);
      if (!sent.ok()) return sent.status();
      return sent->digest;
    };
  }
  auto service = std::make_unique<dtrain::WorkerService>(options);
  metrics.AddGauge("dtrain_worker_job", "1 while a job is set up on this worker.",
                   [s = service.get()](const auto& emit) {
                     const std::string job = s->current_job();
                     emit({{"job", job}}, job.empty() ? 0 : 1);
                   });
  if (artifacts != nullptr) {
    dtrain::ArtifactCache* cache = artifacts.get();
    metrics.AddGauge(
        "dtrain_worker_artifact_cache_hits_total",
        "Uploaded files a job named that this worker already had.",
        [cache](const auto& emit) { emit({}, static_cast<double>(cache->hits())); }, "counter");
    metrics.AddGauge(
        "dtrain_worker_artifact_cache_misses_total",
        "Uploaded files this worker fetched from the coordinator.",
        [cache](const auto& emit) { emit({}, static_cast<double>(cache->misses())); }, "counter");
    metrics.AddGauge("dtrain_worker_artifact_cache_bytes", "Bytes in this worker's file cache.",
                     [cache](const auto& emit) { emit({}, static_cast<double>(cache->bytes())); });
  }
  std::unique_ptr<dtrain::MetricsHttpServer> metrics_http;
  if (const std::string listen_metrics = absl::GetFlag(FLAGS_metrics_listen);
      !listen_metrics.empty()) {
    auto http = dtrain::MetricsHttpServer::Start(listen_metrics, &metrics);
    if (!http.ok()) {
      dtrain::LogError(http.status().message());
      return 2;
    }
    metrics_http = std::move(*http);
    dtrain::LogInfo("metrics served", {{"port", metrics_http->port()}, {"path", "/metrics"}});
  }
  dtrain::EnableStandardServices();
  grpc::ServerBuilder builder;
  dtrain::AcceptClientKeepalive(builder);
  dtrain::ListenExclusively(builder);
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(dtrain::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(dtrain::kMaxMessageBytes);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    dtrain::LogError(
        absl::StrCat("cannot listen on ", listen, " (in use, or not an address here)"));
    return 1;
  }
  const std::vector<std::string> services = {dtrain::v1::Worker::service_full_name()};
  dtrain::SetServing(server.get(), services, true);
  dtrain::LogInfo(child ? "serving (ddp_spawn child)" : "serving",
                  {{"worker", options.identity.name}, {"port", port}, {"devices", devices}});
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }

  std::unique_ptr<dtrain::WorkerRegistration> registration;
  if (!child) {
    std::string advertise = absl::GetFlag(FLAGS_advertise);
    if (advertise.empty()) {
      std::string listen_host = colon == std::string::npos ? "" : listen.substr(0, colon);
      if (listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "[::]") {
        listen_host = host;
      }
      advertise = absl::StrCat(listen_host, ":", port);
    }
    dtrain::v1::WorkerInfo self;
    self.set_name(options.identity.name);
    self.set_address(advertise);
    self.set_host(host);
    self.set_devices(devices);
    // What this worker offers beyond dtrain's own, for the coordinator's checks and placement.
    for (const dtrain::PluginInfo& p : dtrain::PluginRegistry::Global().Loaded()) {
      dtrain::v1::Plugin* offered = self.add_plugins();
      offered->set_kind(dtrain::PluginKindName(p.kind));
      offered->set_name(p.name);
      offered->set_description(p.description);
    }
    std::random_device random;
    uint64_t incarnation = 0;
    while (incarnation == 0) incarnation = (uint64_t{random()} << 32) | random();
    self.set_incarnation(incarnation);
    registration = std::make_unique<dtrain::WorkerRegistration>(
        options.identity.coordinator, self, [s = service.get()] { return s->current_job(); },
        [s = service.get()](const std::string& job) { s->AbandonJob(job); });
  }

  const int received = dtrain::WaitForTerminationSignal(signals);
  dtrain::SetServing(server.get(), services, false);
  StopGracefully(*service, registration.get(), signals, received,
                 absl::GetFlag(FLAGS_drain_timeout));
  registration.reset();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  metrics_http.reset();  // its collector reads the service
  server.reset();
  service.reset();
  return 0;
}

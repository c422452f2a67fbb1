// dtrain-worker: the worker daemon. Serves the Worker service (one job at a time), registers
// with the coordinator and heartbeats, and on SIGTERM or SIGINT drains: takes no new job, lets
// the running step finish (or its coordinator checkpoint the job), leaves the job's group
// cleanly, unregisters and exits. The flags become WorkerServerOptions; WorkerServer
// (worker/service/worker_server.h) is the daemon.
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/bearer_token.h"
#include "common/command_line.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/log_flags.h"
#include "common/process_tuning.h"
#include "common/termination_signals.h"
#include "common/tls_flags.h"
#include "common/token_flags.h"
#include "worker/plugins/plugin_registry.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/cpu_placement.h"
#include "worker/runtime/worker_allocator.h"
#include "worker/service/worker_server.h"
#include "worker/strategies/gradient_landing_allocator.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus metrics over HTTP (/metrics); empty: none");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the /metrics port is written here once serving (before --port_file)");
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
ABSL_FLAG(std::string, cpus, "auto",
          "where the step thread (and its compute threads) runs: auto (the default) splits the "
          "cores this process may use with the other auto workers of this host, which it "
          "learns of from the coordinator, one slice each in name order, and moves when one "
          "comes or goes (between jobs); a list in taskset's syntax (0-3,6) pins to those "
          "cores; none leaves the scheduler to place them (slower: see docs/OPERATIONS.md, "
          "\"Cores\"). --threads 0 means one per core of the slice or list; ddp_spawn's "
          "children split it");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(60),
          "on SIGTERM, how long the running step may finish, or the coordinator may checkpoint "
          "the job, before the step is stopped; a second SIGTERM stops it at once");
ABSL_FLAG(std::string, cache_dir, "",
          "where files jobs name by content (uploaded with their spec) are kept between jobs; "
          "default <cache>/worker/<name>, <cache> being $CACHE_DIRECTORY (systemd), "
          "/var/cache/dtrain for root, else $XDG_CACHE_HOME/dtrain or ~/.cache/dtrain");
ABSL_FLAG(int64_t, cache_bytes, int64_t{20} << 30,
          "the cache's size bound; the least recently used files go first; 0: no bound");
ABSL_FLAG(std::string, jobs_dir, "",
          "where this worker writes a job's checkpoints before sending them to the coordinator "
          "(removed when the job leaves); default <state>/worker-jobs/<name>, <state> being "
          "$STATE_DIRECTORY (systemd), /var/lib/dtrain for root, else $XDG_STATE_HOME/dtrain "
          "or ~/.local/state/dtrain");
ABSL_FLAG(bool, trusted_network, false,
          "on a cluster with TLS, let the Gloo plane carry gradients between workers in clear "
          "(Debian's Gloo has no encryption); without it collective_backend auto uses the "
          "coordinator's TLS grpc plane across hosts and gloo is refused. Give it to every worker "
          "or none");
ABSL_FLAG(std::string, host, "",
          "the name this worker's machine goes by in a job: workers with the same --host (and the "
          "same boot) are one node of the rendezvous (node_rank, local_rank), share memory "
          "(collective plane shm) and split cores (--cpus auto); default: the host name. "
          "Different values on one machine rehearse a multi-host job there (Gloo between the "
          "workers; give each its --cpus)");
ABSL_FLAG(bool, child, false,
          "internal: a rank child of a worker daemon (no registration, no ddp_spawn); it "
          "requires DTRAIN_CHILD_SECRET and presents DTRAIN_TOKEN, its job's token");
ABSL_FLAG(std::string, rank_isolation, "auto",
          "where a job's ranks run: process (a child process that never holds this worker's "
          "token), in_process (this daemon's process: no extra hop), or auto (process when the "
          "worker has a token, else in_process). ddp_spawn always uses children");
ABSL_FLAG(std::vector<std::string>, plugin, {},
          "shared libraries of plugins (strategies, precision plugins, accelerators, checkpoint "
          "IO) to load at startup, comma-separated or repeated; see docs/extending.md");

namespace {

std::string SelfBinary() {
  char path[PATH_MAX + 1] = {};
  const ssize_t n = readlink("/proc/self/exe", path, PATH_MAX);
  return n > 0 ? std::string(path, n) : "";
}

// --devices: a number, or 0 for auto (WorkerServer asks libtorch); -1 when neither.
int ParseDevices(const std::string& flag) {
  if (flag == "auto") return 0;
  // The range of the spec's trainer.devices (its Setting option).
  const dtrain::v1::Setting& devices = *dtrain::FindJobSetting("trainer.devices")->setting;
  int n = 0;
  if (!absl::SimpleAtoi(flag, &n) || n < devices.min() || n > devices.max()) return -1;
  return n;
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
  // Not glibc's malloc settings: this process allocates with jemalloc (worker_allocator.h).
  dtrain::TuneLocking();
  // Before any thread allocates: ddp's gradients may be made in shared memory (gradient_landing.h).
  dtrain::InstallGradientLandingAllocator();
  if (absl::Status s = dtrain::ConfigureLoggingFromFlags("dtrain-worker"); !s.ok()) {
    dtrain::LogError(s.message());
    return 2;
  }

  const sigset_t signals = dtrain::BlockTerminationSignals();

  dtrain::WorkerServerOptions options;
  options.identity.devices = ParseDevices(absl::GetFlag(FLAGS_devices));
  if (options.identity.devices < 0) {
    const dtrain::v1::Setting& range = *dtrain::FindJobSetting("trainer.devices")->setting;
    dtrain::LogError(absl::StrCat("--devices must be a number in [", range.min(), ", ", range.max(),
                                  "] or auto, got '", absl::GetFlag(FLAGS_devices), "'"));
    return 2;
  }
  options.child = absl::GetFlag(FLAGS_child);
  if (!options.child) {
    // Said once, at start: a worker whose jemalloc was replaced or given other options still
    // runs, but neither its memory bound (docs/data.md) nor its step rate is the measured one.
    absl::StatusOr<std::string> allocator = dtrain::DescribeWorkerAllocator();
    if (allocator.ok()) {
      dtrain::LogInfo("allocator", {{"malloc", *allocator}});
    } else {
      dtrain::LogWarning(allocator.status().message());
    }
  }
  // Plugins first: a library that cannot load stops the daemon before it takes a job.
  for (const std::string& path : absl::GetFlag(FLAGS_plugin)) {
    if (path.empty()) continue;
    absl::Status loaded = dtrain::PluginRegistry::Global().LoadLibrary(path);
    if (!loaded.ok()) {
      dtrain::LogError(std::string(loaded.message()));
      return 2;
    }
    options.identity.plugins.push_back(path);
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
  absl::StatusOr<std::vector<int>> allowed = dtrain::AllowedCpus();
  if (!allowed.ok()) {
    dtrain::LogError(
        absl::StrCat("cannot read the cores this process may use: ", allowed.status().message()));
    return 2;
  }
  options.allowed_cpus = *allowed;
  options.threads_flag = threads;
  const std::string list = absl::GetFlag(FLAGS_cpus);
  if (list == "none" || (list == "auto" && options.child)) {
    // A rank child is placed by its daemon (--cpus=<its slice>); "none" is the user's choice.
    if (!options.child) {
      dtrain::LogWarning(
          "steps unpinned (--cpus=none): the scheduler moves them between cores, and workers "
          "sharing this host share cores; measured with 2 workers on 2 cores, one thread per "
          "core each: the zoo's MLP trained at 0.85x of its pinned rate (the CNN within the "
          "machine's 5% noise; docs/BENCHMARKS.md); --cpus=auto (the default) or a disjoint "
          "--cpus list per worker avoids it",
          {{"threads", absl::StrCat(threads == 0 ? allowed->size() : threads)}});
    }
  } else if (list == "auto") {
    // Until the coordinator names the other workers here: all of this process's cores, as if
    // alone. The first registration's answer moves it (cpu_placement.h).
    options.place_cpus = true;
    options.quota_cores = dtrain::CpuQuotaCores();
    const dtrain::CpuPlacement alone =
        dtrain::PlaceSteps("", *allowed, threads, {}, options.quota_cores);
    options.identity.cpus = alone.cpus;
    threads = alone.threads;
    dtrain::LogInfo(
        absl::StrCat("steps placed (--cpus=auto): ", alone.reason,
                     "; the split follows the other workers of this host as they "
                     "register with the coordinator"),
        {{"cpus", dtrain::FormatCpuList(alone.cpus)}, {"threads", absl::StrCat(threads)}});
  } else {
    absl::StatusOr<std::vector<int>> checked = dtrain::CheckCpuList(list);
    if (!checked.ok()) {
      dtrain::LogError(absl::StrCat("--cpus: ", checked.status().message(), " (or auto, or none)"));
      return 2;
    }
    options.identity.cpus = *std::move(checked);
    const int cores = static_cast<int>(options.identity.cpus.size());
    if (threads == 0) threads = cores;
    if (threads > cores) {
      dtrain::LogError(absl::StrCat("--threads=", threads, " is more than the ", cores,
                                    " core(s) of --cpus=", list,
                                    "; the threads would share cores: list more cores or "
                                    "lower --threads"));
      return 2;
    }
    dtrain::LogInfo("steps pinned", {{"cpus", dtrain::FormatCpuList(options.identity.cpus)},
                                     {"threads", absl::StrCat(threads)}});
  }
  dtrain::SetComputeThreads(threads);
  options.identity.threads = threads;
  options.identity.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.identity.trusted_network = absl::GetFlag(FLAGS_trusted_network);
  options.identity.host = absl::GetFlag(FLAGS_host);
  options.identity.name = absl::GetFlag(FLAGS_name);
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.spawn_binary = options.child ? "" : SelfBinary();
  options.advertise_address = absl::GetFlag(FLAGS_advertise);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  options.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  options.cache_bytes = absl::GetFlag(FLAGS_cache_bytes);
  options.jobs_dir = absl::GetFlag(FLAGS_jobs_dir);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);

  // ddp_spawn children listen on 127.0.0.1 only and are reached by their parent alone.
  auto credentials = dtrain::ServerCredentialsFor(
      options.listen_address, dtrain::TlsFilesFromFlags(),
      !options.child && dtrain::RequireClientCertFromFlags(), dtrain::InsecureFromFlags());
  if (!credentials.ok()) {
    dtrain::LogError(credentials.status().message());
    return 2;
  }
  options.credentials = options.child ? grpc::InsecureServerCredentials() : *credentials;
  // The worker is a client of its coordinator (and a ddp_spawn parent's children inherit it).
  if (absl::Status s = dtrain::ConfigureClientTlsFromFlags(); !s.ok()) {
    dtrain::LogError(s.message());
    return 2;
  }
  if (options.child) {
    // A rank child presents its job's token (DTRAIN_TOKEN, as its daemon set it) and requires
    // the secret its daemon made for the job; neither is the daemon's own token.
    const char* secret = std::getenv(dtrain::kChildSecretEnvironment);
    if (secret == nullptr || *secret == '\0') {
      dtrain::LogError(absl::StrCat("--child is started by a worker daemon, which sets ",
                                    dtrain::kChildSecretEnvironment, "; it is not set"));
      return 2;
    }
    options.token = secret;
    unsetenv(dtrain::kChildSecretEnvironment);  // nothing this child starts inherits it
    absl::StatusOr<std::string> job_token = dtrain::ConfigureClientTokenFromFlags();
    if (!job_token.ok()) {
      dtrain::LogError(job_token.status().message());
      return 2;
    }
  } else {
    // One token both ways: presented to the coordinator, and required of whoever calls this
    // worker (the coordinator).
    absl::StatusOr<std::string> token =
        dtrain::ConfigureServerTokenFromFlags(options.listen_address);
    if (!token.ok()) {
      dtrain::LogError(token.status().message());
      return 2;
    }
    options.token = *token;
  }
  const std::string isolation = absl::GetFlag(FLAGS_rank_isolation);
  if (isolation == "process") {
    options.isolate_ranks = true;
  } else if (isolation == "in_process") {
    options.isolate_ranks = false;
  } else if (isolation == "auto") {
    options.isolate_ranks = !options.token.empty() && !options.spawn_binary.empty();
    if (!options.token.empty() && options.spawn_binary.empty()) {
      dtrain::LogWarning(
          "ranks run in this process, which holds the worker's token: this program's path is "
          "not known, so it cannot start rank children");
    }
  } else {
    dtrain::LogError(absl::StrCat("--rank_isolation must be process, in_process or auto, got '",
                                  isolation, "'"));
    return 2;
  }
  if (!options.child) {
    // Rank children do not see the token file (worker/runtime/spawned_job.h).
    const absl::CommandLineFlag* file = absl::FindCommandLineFlag("token_file");
    if (file != nullptr && !file->CurrentValue().empty()) {
      std::error_code error;
      const std::filesystem::path path = std::filesystem::absolute(file->CurrentValue(), error);
      if (!error) options.identity.hidden_files.push_back(path.lexically_normal().string());
    }
  }
  if (!options.child && !options.token.empty()) {
    // Processes of the same user (a rank child running a model included) may not read this
    // one's memory or its /proc environ, where the token is. Children it starts are dumpable
    // again (execve), and get only their job's token.
    prctl(PR_SET_DUMPABLE, 0);
  }
  if (!options.child) {
    dtrain::LogInfo(
        "ranks", {{"run_in", options.isolate_ranks ? "a child process per job" : "this process"}});
  }

  absl::StatusOr<std::unique_ptr<dtrain::WorkerServer>> server =
      dtrain::WorkerServer::Start(std::move(options));
  if (!server.ok()) {
    dtrain::LogError(server.status().message());
    return server.status().code() == absl::StatusCode::kUnavailable ? 1 : 2;
  }
  const int received = dtrain::WaitForTerminationSignal(signals);
  (*server)->Drain(strsignal(received), [&signals](absl::Duration wait) {
    const timespec poll = absl::ToTimespec(wait);
    return sigtimedwait(&signals, nullptr, &poll) > 0;
  });
  if (absl::Status stopped = (*server)->Stop(); !stopped.ok()) {
    // A thread still runs the stuck call: exit without the destructors it could race with.
    dtrain::LogError(stopped.message());
    std::_Exit(1);
  }
  return 0;
}

// dtrain-coordinator: runs the coordinator service until SIGTERM or SIGINT.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/directories.h"
#include "common/log.h"
#include "common/log_flags.h"
#include "common/port_file.h"
#include "common/process_tuning.h"
#include "common/termination_signals.h"
#include "common/tls_flags.h"
#include "common/token_flags.h"
#include "coordinator/coordinator_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:29610",
          "host:port to serve on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "a member silent this long is declared dead and its group fails");
ABSL_FLAG(double, max_worker_heartbeats_per_second, 500,
          "worker daemons' heartbeats per second as a whole (0: no cap); past "
          "--heartbeat_interval x this many workers, their interval and lost timeout grow in "
          "proportion");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "how often members are told to send heartbeats");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Minutes(10),
          "default deadline of a collective, counted from its first rank's arrival");
ABSL_FLAG(absl::Duration, register_timeout, absl::Minutes(5),
          "default time a registration waits for its group to form");
ABSL_FLAG(std::string, state_dir, "",
          "the job database (<state_dir>/coordinator.db) and jobs' logs, metrics (CSV, "
          "TensorBoard) and checkpoints (<state_dir>/jobs/); a restart resumes from it. Default: "
          "<state>/coordinator, where <state> is $STATE_DIRECTORY (systemd), /var/lib/dtrain "
          "for root, else $XDG_STATE_HOME/dtrain or ~/.local/state/dtrain");
ABSL_FLAG(std::string, advertise, "",
          "host:port workers use to reach this coordinator (port 0: the port it listens on); "
          "default: --listen");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus metrics over HTTP (/metrics); empty: none");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the /metrics port is written to this file once serving");
ABSL_FLAG(int64_t, max_artifact_bytes, int64_t{64} << 30,
          "the largest file a client may upload (a model, a dataset, a checkpoint); 0: no limit");
ABSL_FLAG(int64_t, artifact_quota_bytes, 0,
          "the total bytes of uploaded files kept under <state_dir>/artifacts; 0: no limit");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the dashboard and the HTTP JSON API (/api/v1/); empty: none. HTTPS with "
          "--tls_cert/--tls_key; beyond loopback it needs --token_file (or --insecure)");
ABSL_FLAG(std::vector<std::string>, http_allowed_hosts, {},
          "comma-separated host names the dashboard answers for (the Host header; '*': any), "
          "against DNS rebinding; empty: the --http_listen host, localhost, 127.0.0.1, ::1 and "
          "this machine's name. Add the name users type, or a reverse proxy's");
ABSL_FLAG(std::string, http_port_file, "",
          "if set, the dashboard's bound port is written to this file once serving");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written to this file once serving");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dtrain-coordinator: rendezvous, collectives and key-value store over gRPC.\n"
      "Usage: dtrain-coordinator [--listen=127.0.0.1:29610] [--heartbeat-timeout=10s] "
      "[--collective-timeout=10m] [--tls_cert=F --tls_key=F [--tls_ca=F] "
      "[--tls_require_client_cert]] [--token_file=F] [--insecure]");
  const dtrain::CommandLine command_line =
      dtrain::ParseFlagsOrExit(argc, argv, "dtrain-coordinator");
  if (!command_line.positional.empty()) {
    std::fprintf(stderr, "dtrain-coordinator: unexpected argument '%s'; --help lists every flag\n",
                 command_line.positional[0].c_str());
    return 2;
  }

  dtrain::TuneProcessForDtrain();
  if (absl::Status s = dtrain::ConfigureLoggingFromFlags("dtrain-coordinator"); !s.ok()) {
    dtrain::LogError(s.message());
    return 2;
  }

  const sigset_t signals = dtrain::BlockTerminationSignals();

  dtrain::CoordinatorOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.groups.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.groups.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.max_worker_heartbeats_per_second = absl::GetFlag(FLAGS_max_worker_heartbeats_per_second);
  options.groups.default_collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  options.groups.default_register_timeout = absl::GetFlag(FLAGS_register_timeout);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  if (options.state_dir.empty())
    options.state_dir = dtrain::DefaultStateDirectory() + "/coordinator";
  options.max_artifact_bytes = absl::GetFlag(FLAGS_max_artifact_bytes);
  options.artifact_quota_bytes = absl::GetFlag(FLAGS_artifact_quota_bytes);
  options.database = options.state_dir + "/coordinator.db";
  options.advertise_address = absl::GetFlag(FLAGS_advertise);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.http_tls = dtrain::TlsFilesFromFlags();
  options.http_insecure = dtrain::InsecureFromFlags();
  options.http_allowed_hosts = absl::GetFlag(FLAGS_http_allowed_hosts);
  if (options.max_worker_heartbeats_per_second < 0) {
    dtrain::LogError("--max_worker_heartbeats_per_second must be >= 0 (0: no cap)");
    return 2;
  }
  // Zero would fail every collective (or registration) at once rather than wait forever, and
  // an infinite one would be a wait without a deadline.
  for (const auto& [flag, value] :
       {std::pair<const char*, absl::Duration>{"--collective_timeout",
                                               options.groups.default_collective_timeout},
        {"--register_timeout", options.groups.default_register_timeout}}) {
    if (value <= absl::ZeroDuration() || value == absl::InfiniteDuration()) {
      dtrain::LogError(absl::StrCat(flag, " must be a positive, finite duration (got ",
                                    absl::FormatDuration(value), ")"));
      return 2;
    }
  }
  if (options.groups.heartbeat_timeout <= options.groups.heartbeat_interval) {
    dtrain::LogError(absl::StrCat("--heartbeat-timeout (",
                                  absl::FormatDuration(options.groups.heartbeat_timeout),
                                  ") must exceed --heartbeat-interval (",
                                  absl::FormatDuration(options.groups.heartbeat_interval), ")"));
    return 2;
  }
  auto credentials = dtrain::ServerCredentialsFor(
      options.listen_address, dtrain::TlsFilesFromFlags(), dtrain::RequireClientCertFromFlags(),
      dtrain::InsecureFromFlags());
  if (!credentials.ok()) {
    dtrain::LogError(credentials.status().message());
    return 2;
  }
  options.credentials = *credentials;
  // The coordinator is also a client, of its workers: same CA, same certificate.
  if (absl::Status s = dtrain::ConfigureClientTlsFromFlags(); !s.ok()) {
    dtrain::LogError(s.message());
    return 2;
  }
  // The same token is required of callers and presented to the workers.
  absl::StatusOr<std::string> token = dtrain::ConfigureServerTokenFromFlags(options.listen_address);
  if (!token.ok()) {
    dtrain::LogError(token.status().message());
    return 2;
  }
  options.admin_token = *token;
  auto server = dtrain::CoordinatorServer::Start(options);
  if (!server.ok()) {
    dtrain::LogError(server.status().ToString());
    return 1;
  }
  dtrain::LogInfo("serving",
                  {{"address", (*server)->address()},
                   {"heartbeat_timeout", absl::FormatDuration(options.groups.heartbeat_timeout)},
                   {"auth", token->empty() ? "none (every caller is an admin)" : "bearer tokens"},
                   {"state_dir", options.state_dir}});
  if ((*server)->metrics_port() > 0) {
    dtrain::LogInfo(
        "metrics served",
        {{"url", absl::StrCat("http://",
                              options.metrics_listen.substr(0, options.metrics_listen.rfind(':')),
                              ":", (*server)->metrics_port(), "/metrics")}});
  }
  if (!(*server)->web_url().empty()) {
    dtrain::LogInfo("dashboard served", {{"url", (*server)->web_url()}});
  }
  auto write_port = [](const std::string& file, int port) {
    if (absl::Status s = dtrain::WritePortFile(file, port); !s.ok())
      dtrain::LogWarning(s.message());
  };
  // The dashboard's and the metrics' first: a reader of the gRPC port file then finds them.
  write_port(absl::GetFlag(FLAGS_http_port_file), (*server)->web_port());
  write_port(absl::GetFlag(FLAGS_metrics_port_file), (*server)->metrics_port());
  write_port(absl::GetFlag(FLAGS_port_file), (*server)->port());
  const int received = dtrain::WaitForTerminationSignal(signals);
  dtrain::LogInfo("shutting down: running jobs are interrupted and resume at the next start",
                  {{"signal", strsignal(received)}});
  (*server)->Shutdown();
  return 0;
}

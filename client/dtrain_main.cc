// dtrain: the command line for submitting and watching training jobs, shaped like LightningCLI:
//   dtrain fit|validate|test|predict --config job.yaml [--config more.yaml]
//          [--trainer.max_epochs=5 ...] [--print_config] [--wait] [--dry_run]
//   dtrain status JOB   dtrain list   dtrain watch JOB   dtrain logs JOB [--follow]
//   dtrain cancel JOB   dtrain workers   dtrain results JOB [--plot FILE.svg]   dtrain health
//   dtrain download JOB [best|last|NAME|predictions] [-o DIR]   dtrain delete JOB
// --coordinator host:port (or DTRAIN_COORDINATOR); --token / --token_file (or DTRAIN_TOKEN) when
// the coordinator requires one; --output json on every command (errors too). The exit status
// is 0 on success (and for --help), 1 when a job failed or was cancelled (the reason is
// printed), 2 for a usage error or a spec the client refuses, 3 when the coordinator refused
// or could not be reached.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/artifacts_client.h"
#include "client/job_files.h"
#include "client/job_spec_file.h"
#include "client/jobs_client.h"
#include "client/metrics_plot.h"
#include "client/progress_view.h"
#include "client/spec_uploads.h"
#include "common/channel.h"
#include "common/command_line.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/tls_flags.h"
#include "common/token_flags.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "dtrain/v1/workers.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "",
          "the coordinator's host:port; default $DTRAIN_COORDINATOR or 127.0.0.1:29610");
ABSL_FLAG(std::string, output, "text", "text or json");
ABSL_FLAG(bool, wait, false,
          "fit/validate/test/predict: watch the job until it ends; exit as it ended");
ABSL_FLAG(bool, dry_run, false,
          "fit/validate/test/predict: have an idle worker load the model and data and run one "
          "training_step and one validation_step, report what it found, and queue nothing");
ABSL_FLAG(bool, print_config, false,
          "fit/validate/test/predict: print the resolved job spec as YAML (defaults filled in) "
          "and submit nothing");
ABSL_FLAG(bool, follow, false, "logs: keep printing new lines until the job ends");
ABSL_FLAG(std::string, plot, "", "results: also draw the loss and accuracy curves to this .svg");
ABSL_FLAG(std::string, o, ".", "download: the directory the files go to");
ABSL_FLAG(int, limit, 50, "list: the newest this many jobs (0: all)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "deadline of each request");
ABSL_FLAG(std::string, service, "",
          "health: the service to check (dtrain.v1.Coordinator, dtrain.v1.Workers, dtrain.v1.Jobs, "
          "dtrain.v1.Worker); \"\": the server as a whole");

namespace dtrain {
namespace {

constexpr int kOk = 0, kJobFailed = 1, kUsage = 2, kRefused = 3;

bool Json() { return absl::GetFlag(FLAGS_output) == "json"; }

std::string Address() {
  std::string address = absl::GetFlag(FLAGS_coordinator);
  if (address.empty() && std::getenv("DTRAIN_COORDINATOR") != nullptr) {
    address = std::getenv("DTRAIN_COORDINATOR");
  }
  return address.empty() ? "127.0.0.1:29610" : address;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string ToJsonLine(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

// An error for the user: `dtrain: message` on stderr, or with --output json
// {"error": {"code": "INVALID_ARGUMENT", "message": "..."}, "exit_code": 2} on stdout, where a
// script reading the output finds it.
int Fail(int exit_code, absl::StatusCode code, const std::string& message) {
  if (Json()) {
    google::protobuf::Struct out;
    auto& error = *(*out.mutable_fields())["error"].mutable_struct_value()->mutable_fields();
    error["code"].set_string_value(absl::StatusCodeToString(code));
    error["message"].set_string_value(message);
    (*out.mutable_fields())["exit_code"].set_number_value(exit_code);
    std::printf("%s\n", ToJsonLine(out).c_str());
  } else {
    std::fprintf(stderr, "dtrain: %s\n", message.c_str());
  }
  return exit_code;
}

int UsageError(const std::string& message) {
  return Fail(2, absl::StatusCode::kInvalidArgument, message);
}

int Refused(const absl::Status& s, const std::string& address = Address()) {
  if (s.code() == absl::StatusCode::kUnavailable ||
      s.code() == absl::StatusCode::kDeadlineExceeded) {
    // A TLS server closes a plaintext or unverifiable connection at once: say so, since
    // "start a coordinator" would send the user the wrong way.
    const bool maybe_tls = absl::StrContains(s.message(), "Socket closed") ||
                           absl::StrContains(s.message(), "SSL") ||
                           absl::StrContains(s.message(), "handshake");
    return Fail(kRefused, s.code(),
                absl::StrCat("cannot reach ", address, " (", s.message(), "); ",
                             maybe_tls ? "if it uses TLS, set --tls_ca / DTRAIN_TLS_CA to its CA "
                                         "(and --tls_cert/--tls_key or DTRAIN_TLS_CERT/"
                                         "DTRAIN_TLS_KEY if it requires client certificates)"
                                       : "start one with deploy/local/cluster.sh start, or set "
                                         "--coordinator / DTRAIN_COORDINATOR"));
  }
  if (Json()) return Fail(kRefused, s.code(), std::string(s.message()));
  std::fprintf(stderr, "dtrain: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
  return kRefused;
}

int ExitFor(const v1::JobStatus& status) {
  if (status.state() == v1::SUCCEEDED) return kOk;
  if (Json()) return kJobFailed;  // the printed status holds the state and reason
  std::fprintf(stderr, "dtrain: job %s %s%s%s\n", status.id().c_str(),
               v1::JobState_Name(status.state()).c_str(), status.reason().empty() ? "" : ": ",
               status.reason().c_str());
  return kJobFailed;
}

// 1.5 MB, 312 kB, 17 B: sizes as a person reads them.
std::string HumanBytes(int64_t bytes) {
  if (bytes >= 1000 * 1000 * 1000) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1000 * 1000) return absl::StrFormat("%.1f MB", bytes / 1e6);
  if (bytes >= 1000) return absl::StrFormat("%.0f kB", bytes / 1e3);
  return absl::StrCat(bytes, " B");
}

class Client {
 public:
  Client() : jobs_(Address(), absl::GetFlag(FLAGS_timeout)) {}

  // fit / validate / test / predict: the configs and overrides make one spec, checked here
  // before anything is sent.
  int Submit(const std::string& stage, const std::vector<std::string>& configs,
             const std::vector<std::pair<std::string, std::string>>& overrides) {
    absl::StatusOr<v1::JobSpec> spec = ReadJobConfig(configs, overrides);
    v1::JobSpec normalized;
    if (spec.ok()) {
      spec->set_stage(stage);
      normalized = *spec;
      absl::Status valid = NormalizeJobSpec(&normalized);
      if (!valid.ok()) spec = valid;
    }
    if (!spec.ok()) return UsageError(std::string(spec.status().message()));
    if (absl::GetFlag(FLAGS_print_config)) {
      if (Json()) {
        std::printf("%s\n", ToJson(normalized).c_str());
      } else {
        std::printf("%s", JobSpecToYaml(normalized).c_str());
      }
      return kOk;
    }
    // The local files the spec names go to the coordinator; the spec names them by content.
    ArtifactsClient artifacts(ConnectToCoordinator(Address()));
    std::vector<std::string> uploaded;
    if (absl::Status s = UploadSpecFiles(artifacts, &*spec, &uploaded); !s.ok()) {
      return s.code() == absl::StatusCode::kInvalidArgument ||
                     s.code() == absl::StatusCode::kNotFound
                 ? UsageError(std::string(s.message()))
                 : Refused(s);
    }
    if (!Json()) {
      for (const std::string& line : uploaded) std::printf("%s\n", line.c_str());
    }
    if (absl::GetFlag(FLAGS_dry_run)) return DryRun(*spec);
    absl::StatusOr<v1::JobStatus> job = jobs_.Submit(*spec);
    if (!job.ok()) return Refused(job.status());
    if (Json() && !absl::GetFlag(FLAGS_wait)) {
      std::printf("%s\n", ToJson(*job).c_str());
      return kOk;
    }
    if (Json()) {
      std::printf("%s\n", ToJsonLine(*job).c_str());
    } else {
      std::printf("submitted %s\n", job->id().c_str());
    }
    std::fflush(stdout);
    if (!absl::GetFlag(FLAGS_wait)) return kOk;
    return Watch(job->id());
  }

  // submit --dry-run: what an idle worker found running one training and one validation step.
  int DryRun(const v1::JobSpec& spec) {
    absl::StatusOr<v1::DryRunResponse> report = jobs_.DryRun(spec);
    if (!report.ok()) return Refused(report.status());
    if (Json()) {
      std::printf("%s\n", ToJson(*report).c_str());
      return kOk;
    }
    std::printf("dry run on worker '%s': the job would run (nothing was queued)\n",
                report->worker().c_str());
    for (const v1::SplitInfo& split : report->splits()) {
      std::printf("  split %-8s %lld samples\n", split.name().c_str(),
                  static_cast<long long>(split.size()));
    }
    std::printf("  parameters      %lld\n", static_cast<long long>(report->parameter_count()));
    std::printf("  batch           %s\n", report->batch().c_str());
    if (report->training_step_keys_size() > 0) {
      std::printf("  training_step   returns %s; loss %.4f\n",
                  absl::StrJoin(report->training_step_keys(), ", ").c_str(), report->loss());
    }
    if (report->validation_step_keys_size() > 0) {
      std::printf("  validation_step returns %s\n",
                  absl::StrJoin(report->validation_step_keys(), ", ").c_str());
    }
    return kOk;
  }

  int Watch(const std::string& id) {
    ProgressView view(isatty(STDOUT_FILENO) && !Json());
    // --output json: one JSON object per line per update (JSON Lines), the last one terminal.
    bool watching = false;
    absl::StatusOr<v1::JobStatus> ended = jobs_.Watch(id, [&](const v1::JobStatus& status) {
      watching = true;
      if (Json()) {
        std::printf("%s\n", ToJsonLine(status).c_str());
        std::fflush(stdout);
      } else {
        view.Show(status);
      }
    });
    view.Done();
    if (!ended.ok() && watching && ended.status().code() == absl::StatusCode::kUnavailable) {
      // Reached, then lost (stopped, frozen or cut off): "start one" would be the wrong advice.
      return Fail(kRefused, ended.status().code(),
                  absl::StrCat("lost the coordinator at ", Address(), " while watching job ", id,
                               " (", ended.status().message(),
                               "); the job is the coordinator's, so watch it again with `dtrain "
                               "watch ",
                               id, "` once the coordinator answers"));
    }
    if (!ended.ok()) return Refused(ended.status());
    const v1::JobStatus& last = *ended;
    if (!Json() && last.state() == v1::SUCCEEDED) PrintMetrics(last);
    return ExitFor(last);
  }

  int Status(const std::string& id) {
    absl::StatusOr<v1::JobStatus> job = Get(id);
    if (!job.ok()) return kRefused;
    if (Json()) {
      std::printf("%s\n", ToJson(*job).c_str());
      return kOk;
    }
    std::printf("%s\n", ProgressLine(*job).c_str());
    if (!job->workers().empty())
      std::printf("workers: %s\n", absl::StrJoin(job->workers(), ", ").c_str());
    if (!job->progress().collective_plane().empty())
      std::printf("collective plane: %s\n", job->progress().collective_plane().c_str());
    if (!job->progress().phase_seconds().empty())
      std::printf("time by phase: %s\n", PhaseLine(job->progress()).c_str());
    PrintMetrics(*job);
    if (!job->checkpoint().empty()) std::printf("checkpoint: %s\n", job->checkpoint().c_str());
    if (!job->predictions().empty()) std::printf("predictions: %s\n", job->predictions().c_str());
    std::printf("logs: %s\n", job->log_dir().c_str());
    return kOk;
  }

  // The job's kept files to `-o DIR`, each verified by its digest.
  int Download(const std::string& id, const std::string& which) {
    absl::StatusOr<v1::JobStatus> job = Get(id);
    if (!job.ok()) return kRefused;
    absl::StatusOr<std::vector<v1::JobFile>> files = SelectJobFiles(*job, which);
    if (!files.ok())
      return Fail(kUsage, files.status().code(), std::string(files.status().message()));
    ArtifactsClient artifacts(ConnectToCoordinator(Address()));
    google::protobuf::Struct out;
    auto& list = *(*out.mutable_fields())["files"].mutable_list_value();
    for (const v1::JobFile& file : *files) {
      absl::StatusOr<std::string> path = DownloadJobFile(artifacts, file, absl::GetFlag(FLAGS_o));
      if (!path.ok()) {
        return path.status().code() == absl::StatusCode::kFailedPrecondition
                   ? Fail(kUsage, path.status().code(), std::string(path.status().message()))
                   : Refused(path.status());
      }
      if (Json()) {
        auto& entry = *list.add_values()->mutable_struct_value()->mutable_fields();
        entry["name"].set_string_value(file.name());
        entry["path"].set_string_value(*path);
        entry["size_bytes"].set_number_value(static_cast<double>(file.size_bytes()));
        entry["digest"].set_string_value(file.digest());
      } else {
        std::printf("%s (%s, %s)\n", path->c_str(), HumanBytes(file.size_bytes()).c_str(),
                    file.digest().c_str());
      }
    }
    if (Json()) std::printf("%s\n", ToJson(out).c_str());
    return kOk;
  }

  int Delete(const std::string& id) {
    absl::StatusOr<v1::DeleteJobResponse> deleted = jobs_.Delete(id);
    if (!deleted.ok()) return Refused(deleted.status());
    if (Json()) {
      std::printf("%s\n", ToJson(*deleted).c_str());
    } else {
      std::printf("deleted %s: %d stored file(s) no other job names, %s freed\n", id.c_str(),
                  deleted->files_removed(), HumanBytes(deleted->freed_bytes()).c_str());
    }
    return kOk;
  }

  int List() {
    // A coordinator keeps every job it ever ran: by default the newest page, not the history.
    const int limit = absl::GetFlag(FLAGS_limit);
    if (limit < 0) return Fail(kUsage, absl::StatusCode::kInvalidArgument, "--limit must be >= 0");
    int total = 0;
    absl::StatusOr<std::vector<v1::JobStatus>> jobs = jobs_.List(limit, &total);
    if (!jobs.ok()) return Refused(jobs.status());
    if (Json()) {
      v1::ListJobsResponse response;
      for (const v1::JobStatus& job : *jobs) *response.add_jobs() = job;
      std::printf("%s\n", ToJson(response).c_str());
      return kOk;
    }
    std::printf("%-28s %-10s %-10s %-14s %s\n", "JOB", "STATE", "PHASE", "STEP", "METRICS");
    for (const v1::JobStatus& job : *jobs) {
      std::string metrics;
      for (const char* key : {"test_acc", "val_acc", "train_loss"}) {
        auto it = job.metrics().find(key);
        if (it != job.metrics().end())
          absl::StrAppend(&metrics, key, "=", absl::StrFormat("%.4f", it->second), " ");
      }
      std::printf(
          "%-28s %-10s %-10s %-14s %s\n", job.id().c_str(), v1::JobState_Name(job.state()).c_str(),
          job.progress().phase().c_str(),
          absl::StrCat(job.progress().global_step(), "/", job.progress().total_steps()).c_str(),
          metrics.c_str());
    }
    if (static_cast<int>(jobs->size()) < total) {
      std::printf("(the newest %zu of %d jobs; --limit 0 lists all)\n", jobs->size(), total);
    }
    return kOk;
  }

  int Logs(const std::string& id) {
    int64_t from = 0;
    while (true) {
      absl::StatusOr<v1::GetJobLogsResponse> logs = jobs_.Logs(id, from);
      if (!logs.ok()) return Refused(logs.status());
      const v1::GetJobLogsResponse& response = *logs;
      if (Json()) {
        // Followed, one object per line (JSON Lines) as watch prints.
        std::printf("%s\n", absl::GetFlag(FLAGS_follow) ? ToJsonLine(response).c_str()
                                                        : ToJson(response).c_str());
      } else {
        for (const std::string& line : response.lines()) std::printf("%s\n", line.c_str());
      }
      std::fflush(stdout);
      from = response.next_line();
      if (!absl::GetFlag(FLAGS_follow)) return kOk;
      absl::StatusOr<v1::JobStatus> job = Get(id);
      if (!job.ok()) return kRefused;
      const bool ended = IsTerminal(job->state());
      if (ended && response.lines_size() == 0) return kOk;
      if (!ended) absl::SleepFor(absl::Milliseconds(500));
    }
  }

  int Cancel(const std::string& id) {
    absl::StatusOr<v1::JobStatus> job = jobs_.Cancel(id);
    if (!job.ok()) return Refused(job.status());
    if (Json()) {
      std::printf("%s\n", ToJson(*job).c_str());
    } else {
      std::printf("cancelling %s\n", id.c_str());
    }
    return kOk;
  }

  int Workers() {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = jobs_.Workers();
    if (!workers.ok()) return Refused(workers.status());
    if (Json()) {
      v1::ListWorkersResponse response;
      for (const v1::WorkerInfo& w : *workers) *response.add_workers() = w;
      std::printf("%s\n", ToJson(response).c_str());
      return kOk;
    }
    std::printf("%-24s %-22s %-7s %-14s %-7s %-10s %s\n", "WORKER", "ADDRESS", "DEVICES", "CPUS",
                "STATE", "SEEN", "JOB");
    for (const v1::WorkerInfo& w : *workers) {
      // Where its steps run: cores and compute threads; "auto" when it places itself.
      const std::string cpus = absl::StrCat(w.cpus().empty() ? "unpinned" : w.cpus(), "/",
                                            w.threads(), "t", w.cpus_auto() ? " auto" : "");
      std::printf("%-24s %-22s %-7d %-14s %-7s %-10s %s\n", w.name().c_str(), w.address().c_str(),
                  w.devices(), cpus.c_str(), v1::WorkerInfo::State_Name(w.state()).c_str(),
                  absl::StrCat(w.last_seen_ms_ago() / 1000.0, "s ago").c_str(),
                  !w.job_id().empty()            ? w.job_id().c_str()
                  : !w.assigned_job_id().empty() ? w.assigned_job_id().c_str()
                                                 : "-");
    }
    return kOk;
  }

  // Exit 0 when the server at `address` (default: the coordinator) reports `service` SERVING;
  // for probes (a Kubernetes exec probe through TLS, a systemd or Slurm readiness wait).
  static int Health(const std::string& address) {
    const std::string target = address.empty() ? Address() : address;
    auto stub = grpc::health::v1::Health::NewStub(ConnectToCoordinator(target));
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(absl::GetFlag(FLAGS_service));
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = stub->Check(&context, request, &response);
    if (!status.ok()) return Refused(FromGrpcStatus(status), target);
    const std::string state =
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
    if (Json()) {
      std::printf("{\n \"status\": \"%s\"\n}\n", state.c_str());
    } else {
      std::printf("%s\n", state.c_str());
    }
    return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kJobFailed;
  }

  int Results(const std::string& id) {
    absl::StatusOr<v1::JobStatus> job = Get(id);
    if (!job.ok()) return kRefused;
    if (!absl::GetFlag(FLAGS_plot).empty()) {
      absl::StatusOr<std::vector<v1::MetricPoint>> points = jobs_.Metrics(id);
      if (!points.ok()) return Refused(points.status());
      absl::Status written = WriteMetricsPlot(absl::GetFlag(FLAGS_plot), id, *points);
      if (!written.ok()) return Fail(kUsage, written.code(), std::string(written.message()));
      if (!Json()) std::printf("plot: %s\n", absl::GetFlag(FLAGS_plot).c_str());
    }
    if (Json()) {
      // {"job", "state", "reason", "metrics": {...}, "checkpoint", "best_checkpoint", "log_dir"}
      google::protobuf::Struct out;
      auto& fields = *out.mutable_fields();
      fields["job"].set_string_value(job->id());
      fields["state"].set_string_value(v1::JobState_Name(job->state()));
      fields["reason"].set_string_value(job->reason());
      auto& metrics = *fields["metrics"].mutable_struct_value()->mutable_fields();
      for (const auto& [name, value] : job->metrics()) metrics[name].set_number_value(value);
      fields["checkpoint"].set_string_value(job->checkpoint());
      fields["best_checkpoint"].set_string_value(job->best_checkpoint());
      fields["log_dir"].set_string_value(job->log_dir());
      fields["predictions"].set_string_value(job->predictions());
      auto& files = *fields["files"].mutable_list_value();
      for (const v1::JobFile& file : job->files()) {
        std::string json;
        google::protobuf::util::JsonPrintOptions options;
        options.preserve_proto_field_names = true;
        (void)google::protobuf::util::MessageToJsonString(file, &json, options);
        (void)google::protobuf::util::JsonStringToMessage(
            json, files.add_values()->mutable_struct_value());
      }
      fields["wall_seconds"].set_number_value(
          job->finished_unix_ms() > 0 ? (job->finished_unix_ms() - job->started_unix_ms()) / 1000.0
                                      : 0);
      std::printf("%s\n", ToJson(out).c_str());
    } else {
      std::printf("%s %s%s%s\n", job->id().c_str(), v1::JobState_Name(job->state()).c_str(),
                  job->reason().empty() ? "" : ": ", job->reason().c_str());
      PrintMetrics(*job);
      if (!job->checkpoint().empty()) std::printf("checkpoint: %s\n", job->checkpoint().c_str());
      if (!job->best_checkpoint().empty())
        std::printf("best checkpoint: %s\n", job->best_checkpoint().c_str());
      if (!job->files().empty()) {
        std::printf("files (dtrain download %s [best|last|NAME|predictions] [-o DIR]):\n",
                    job->id().c_str());
        for (const v1::JobFile& file : job->files()) {
          std::string note;
          if (file.location() == job->best_checkpoint()) note = " best";
          if (file.location() == job->checkpoint()) absl::StrAppend(&note, " last");
          if (file.has_monitored()) {
            absl::StrAppend(&note, " ",
                            job->spec().checkpoint().monitor().empty()
                                ? "monitored"
                                : job->spec().checkpoint().monitor(),
                            "=", absl::StrFormat("%.4f", file.monitored()));
          }
          std::printf("  %-28s %10s  step %-6lld%s%s\n", file.name().c_str(),
                      HumanBytes(file.size_bytes()).c_str(), static_cast<long long>(file.step()),
                      file.digest().empty()
                          ? absl::StrCat(" on the workers: ", file.location()).c_str()
                          : "",
                      note.c_str());
        }
      }
      std::printf("metrics.csv and TensorBoard events: %s\n", job->log_dir().c_str());
    }
    return job->state() == v1::SUCCEEDED || !IsTerminal(job->state()) ? kOk : ExitFor(*job);
  }

 private:
  absl::StatusOr<v1::JobStatus> Get(const std::string& id) {
    absl::StatusOr<v1::JobStatus> job = jobs_.Get(id);
    if (!job.ok()) Refused(job.status());
    return job;
  }

  static void PrintMetrics(const v1::JobStatus& job) {
    for (const auto& [name, value] : job.metrics())
      std::printf("  %-12s %.4f\n", name.c_str(), value);
  }

  JobsClient jobs_;
};

constexpr char kUsageText[] =
    "dtrain: submit and watch training jobs on a dtrain cluster, as LightningCLI runs them.\n"
    "  dtrain fit --config job.yaml [--config more.yaml] [--trainer.max_epochs=5 ...]\n"
    "                                     queue a job; later configs and the dotted overrides\n"
    "                                     win; --wait watches it to its end\n"
    "  dtrain validate|test|predict --config job.yaml [--ckpt_path=F]   the other stages\n"
    "         ... --print_config          print the resolved spec as YAML; queue nothing\n"
    "         ... --dry_run               check it on an idle worker (one training and one\n"
    "                                     validation step); queue nothing\n"
    "  dtrain status JOB                  state, progress, metrics\n"
    "  dtrain list                        every job\n"
    "  dtrain watch JOB                   a live progress bar until the job ends\n"
    "  dtrain logs JOB [--follow]         the job's log\n"
    "  dtrain cancel JOB                  stop a job on every worker\n"
    "  dtrain workers                     registered workers\n"
    "  dtrain results JOB [--plot F.svg]  final metrics and the files it keeps, with sizes;\n"
    "                                     curves to an SVG\n"
    "  dtrain download JOB [best|last|NAME|predictions] [-o DIR]\n"
    "                                     bring the job's files here (default: all, to .)\n"
    "  dtrain delete JOB                  forget an ended job and free its stored files\n"
    "  dtrain health [HOST:PORT] [--service S]  SERVING (exit 0) or not (exit 1), any dtrain "
    "server\n"
    "Exit status: 0 success, 1 the job failed or was cancelled, 2 usage error or refused spec,\n"
    "3 the coordinator refused the request or could not be reached.";

bool IsStage(const std::string& command) {
  return command == "fit" || command == "validate" || command == "test" || command == "predict";
}

// --output json, read from argv before the flags are parsed, so that a usage error in the
// flags themselves is JSON too.
bool AskedForJson(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--output=json") return true;
    if (arg == "--output" && i + 1 < argc && std::string(argv[i + 1]) == "json") return true;
  }
  return false;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsageText);
  // Top-level spec keys are overrides too (--ckpt_path=F, --seed_everything=3), as are the
  // renamed ones, so that they get their hint rather than "unknown flag".
  std::set<std::string> options = {"config", "resume_from"};
  const google::protobuf::Descriptor* spec = v1::JobSpec::descriptor();
  for (int i = 0; i < spec->field_count(); ++i) options.insert(spec->field(i)->name());
  const CommandLine line = ParseFlags(argc, argv, /*dotted=*/true, options);
  if (line.outcome == CommandLine::Outcome::kHelp) {
    std::fputs(FlagsHelp({{"config",
                           "fit/validate/test/predict: a job spec file (YAML or JSON); "
                           "repeat it to layer several, later wins"},
                          {"SECTION.KEY",
                           "fit/validate/test/predict: set one spec key, e.g. "
                           "--trainer.max_epochs=5 (YAML value); top-level keys "
                           "too: --ckpt_path=F, --seed_everything=1"}})
                   .c_str(),
               stdout);
    return kOk;
  }
  if (line.outcome == CommandLine::Outcome::kUsageError) {
    if (AskedForJson(argc, argv)) absl::SetFlag(&FLAGS_output, "json");
    return UsageError(line.error);
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "text" && output != "json") {
    absl::SetFlag(&FLAGS_output, "text");
    return UsageError(absl::StrCat("--output is text or json, got '", output, "'"));
  }
  const std::vector<std::string>& positional = line.positional;
  if (positional.empty()) return UsageError(absl::StrCat("give a command\n", kUsageText));
  if (absl::Status s = ConfigureClientTlsFromFlags(); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (absl::StatusOr<std::string> token = ConfigureClientTokenFromFlags(); !token.ok()) {
    return UsageError(std::string(token.status().message()));
  }
  const std::string command = positional[0];
  std::vector<std::string> configs;
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& [name, value] : line.options) {
    if (name == "config") {
      configs.push_back(value);
    } else {
      overrides.emplace_back(name, value);
    }
  }
  if (!IsStage(command) && (!configs.empty() || !overrides.empty())) {
    return UsageError(absl::StrCat("dtrain ", command, " takes no --config or --",
                                   overrides.empty() ? "config" : overrides[0].first,
                                   "; those belong to fit, validate, test and predict"));
  }
  if (command == "submit") {
    return UsageError(absl::StrCat(
        "'submit' is now the stage's subcommand, as LightningCLI's: dtrain fit --config ",
        positional.size() > 1 ? positional[1] : "JOB.yaml", " (or validate, test, predict)"));
  }
  if (IsStage(command)) {
    if (positional.size() > 1) {
      return UsageError(
          absl::StrCat("dtrain ", command, ": give the spec as --config ", positional[1]));
    }
    if (configs.empty() && overrides.empty()) {
      return UsageError(absl::StrCat("dtrain ", command, ": give --config FILE (YAML or JSON)"));
    }
    Client client;
    return client.Submit(command, configs, overrides);
  }
  const std::string arg = positional.size() > 1 ? positional[1] : "";
  if (command == "download") {
    if (positional.size() < 2) return UsageError("dtrain download: give a job id");
    if (positional.size() > 3) {
      return UsageError(absl::StrCat("dtrain download: unexpected argument '", positional[3], "'"));
    }
    Client client;
    return client.Download(arg, positional.size() > 2 ? positional[2] : "");
  }
  if (positional.size() > 2) {
    return UsageError(
        absl::StrCat("dtrain ", command, ": unexpected argument '", positional[2], "'"));
  }
  auto need_arg = [&](const char* what) {
    if (!arg.empty()) return true;
    UsageError(absl::StrCat("dtrain ", command, ": give ", what));
    return false;
  };
  Client client;
  if (command == "status") return need_arg("a job id") ? client.Status(arg) : kUsage;
  if (command == "watch") return need_arg("a job id") ? client.Watch(arg) : kUsage;
  if (command == "logs") return need_arg("a job id") ? client.Logs(arg) : kUsage;
  if (command == "cancel") return need_arg("a job id") ? client.Cancel(arg) : kUsage;
  if (command == "results") return need_arg("a job id") ? client.Results(arg) : kUsage;
  if (command == "delete") return need_arg("a job id") ? client.Delete(arg) : kUsage;
  if (command == "list") return client.List();
  if (command == "workers") return client.Workers();
  if (command == "health") return Client::Health(arg);
  return UsageError(absl::StrCat("unknown command '", command, "'; --help lists them"));
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) { return dtrain::Main(argc, argv); }

#include "worker/runtime/spawned_job.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>

#include <grpcpp/create_channel.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bearer_token.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/runtime/cpu_affinity.h"

extern char** environ;  // NOLINT: POSIX

namespace dtrain {
namespace {

constexpr absl::Duration kChildStartTimeout = absl::Seconds(60);
constexpr absl::Duration kFailureGrace = absl::Seconds(5);
constexpr absl::Duration kStopGrace = absl::Seconds(5);

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

// This process's environment without its bearer token, with `token` (the job's) and
// `secret` (the child's channel secret) instead: a child never sees the daemon's token.
std::vector<std::string> ChildEnvironment(const std::string& token, const std::string& secret) {
  std::vector<std::string> out;
  const std::string token_prefix = absl::StrCat(kTokenEnvironment, "=");
  const std::string secret_prefix = absl::StrCat(kChildSecretEnvironment, "=");
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    if (absl::StartsWith(entry, token_prefix) || absl::StartsWith(entry, secret_prefix)) continue;
    out.emplace_back(entry);
  }
  if (!token.empty()) out.push_back(token_prefix + token);
  out.push_back(secret_prefix + secret);
  return out;
}

// What a child does before exec to hide files from itself: each path in `paths` covered by a
// bind mount of `empty` (an empty file) in a mount namespace of its own. Strings prepared
// before fork, so that the child makes only system calls.
struct HiddenFiles {
  std::vector<std::string> paths;
  std::string empty;
  std::string uid_map, gid_map;  // "<id> <id> 1": the user namespace maps the user to itself
};

// In the child, between fork and exec: a private mount namespace (a user namespace first when
// this process may not make one by itself) in which every hidden path shows `empty`. Nothing
// happens when the kernel or a container refuses a namespace; the daemon then says so.
void HideFiles(const HiddenFiles& hidden) {
  if (hidden.paths.empty()) return;
  if (unshare(CLONE_NEWNS) != 0) {
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return;
    auto write_file = [](const char* path, const char* text, size_t size) {
      const int fd = open(path, O_WRONLY | O_CLOEXEC);
      if (fd < 0) return false;
      const bool ok = write(fd, text, size) == static_cast<ssize_t>(size);
      close(fd);
      return ok;
    };
    if (!write_file("/proc/self/setgroups", "deny", 4) ||
        !write_file("/proc/self/uid_map", hidden.uid_map.data(), hidden.uid_map.size()) ||
        !write_file("/proc/self/gid_map", hidden.gid_map.data(), hidden.gid_map.size())) {
      return;
    }
  }
  // Mounts made here stay in this namespace.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return;
  for (const std::string& path : hidden.paths) {
    mount(hidden.empty.c_str(), path.c_str(), nullptr, MS_BIND, nullptr);
  }
}

// fork + exec with the child tied to this process's life. Only async-signal-safe calls
// between fork and exec: the arguments are prepared before.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& args,
                            const std::vector<std::string>& environment,
                            const HiddenFiles& hidden) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork failed: ", strerror(errno)));
  if (pid == 0) {
    // Out of the daemon's process group: a terminal's Ctrl-C or a group-wide SIGTERM reaches
    // the daemon alone, which drains and then stops its children itself.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(125);  // the parent died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the daemon blocks SIGTERM for sigwait
    HideFiles(hidden);
    // No descriptor of the daemon's (a connection, a file some library opened without
    // O_CLOEXEC) reaches the child.
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SpawnedJob>> SpawnedJob::StartChildren(
    const std::string& job_id, const std::string& token, const WorkerIdentity& identity,
    const std::string& binary, int n, bool per_device) {
  std::unique_ptr<SpawnedJob> job(new SpawnedJob());
  job->id_ = job_id;
  job->what_ = per_device ? "ddp_spawn" : "rank child";
  // What the children present to the coordinator is the job's token; what they require of
  // this daemon, a secret of this job's alone.
  const std::string secret = NewRandomToken();
  const std::vector<std::string> environment = ChildEnvironment(token, secret);
  HiddenFiles hidden;
  char dir_template[] = "/tmp/dtrain-spawn-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot make a temporary directory: ", strerror(errno)));
  }
  const std::string dir = dir_template;
  for (const std::string& path : identity.hidden_files) {
    if (access(path.c_str(), F_OK) == 0) hidden.paths.push_back(path);
  }
  if (!hidden.paths.empty()) {
    hidden.empty = dir + "/empty";
    const int fd = open(hidden.empty.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
    if (fd >= 0) close(fd);
    hidden.uid_map = absl::StrCat(geteuid(), " ", geteuid(), " 1\n");
    hidden.gid_map = absl::StrCat(getegid(), " ", getegid(), " 1\n");
  }
  const LogOptions log = CurrentLogOptions();  // children log as their daemon does
  for (int i = 0; i < n; ++i) {
    const std::string port_file = absl::StrCat(dir, "/child-", i, ".port");
    // Each child's step thread gets its own slice of this worker's cores, and no more compute
    // threads than the slice has cores.
    const std::vector<int> cpus = CpusOfLocalProcess(identity.cpus, i, n);
    const int threads = cpus.empty()
                            ? identity.threads
                            : std::min<int>(identity.threads, static_cast<int>(cpus.size()));
    std::vector<std::string> args = {
        binary,
        "--child",
        "--listen=127.0.0.1:0",
        "--port_file=" + port_file,
        absl::StrCat("--name=", identity.name, "/", i),
        "--coordinator=" + identity.coordinator,
        absl::StrCat("--devices=", per_device ? 1 : identity.devices),
        absl::StrCat("--threads=", threads),
        absl::StrCat("--log_level=", LogLevelName(log.min_level)),
        absl::StrCat("--log_format=", log.format == LogFormat::kJson ? "json" : "text")};
    if (!cpus.empty()) args.push_back("--cpus=" + FormatCpuList(cpus));
    if (!identity.cache_dir.empty()) {
      args.push_back(absl::StrCat("--cache_dir=", identity.cache_dir, "/child-", i));
      args.push_back(absl::StrCat("--cache_bytes=", identity.cache_bytes));
    }
    // The children run the job's precision and checkpoint IO too, plugins included.
    for (const std::string& plugin : identity.plugins) args.push_back("--plugin=" + plugin);
    if (identity.trusted_network) args.push_back("--trusted_network");
    args.push_back("--host=" + identity.host);
    absl::StatusOr<pid_t> pid = Spawn(args, environment, hidden);
    if (!pid.ok()) return pid.status();
    auto child = std::make_unique<Child>();
    child->pid = *pid;
    Child* raw = child.get();
    child->reaper = std::thread([job = job.get(), raw] {
      int status = 0;
      while (waitpid(raw->pid, &status, 0) < 0 && errno == EINTR) {
      }
      absl::MutexLock lock(&job->mu_);
      raw->exited = true;
      raw->wait_status = status;
    });
    job->children_.push_back(std::move(child));
  }
  // Each child writes its port once it serves.
  for (int i = 0; i < n; ++i) {
    const std::string port_file = absl::StrCat(dir, "/child-", i, ".port");
    const absl::Time deadline = absl::Now() + kChildStartTimeout;
    int port = 0;
    while (port == 0) {
      std::ifstream in(port_file);
      if (in >> port && port > 0) break;
      port = 0;
      const std::string exited = job->ExitDescription(i);
      if (!exited.empty()) {
        return absl::AbortedError(absl::StrCat(job->what_, ": ", exited, " before serving"));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(job->what_, ": local rank ", i, " (pid ",
                                                        job->children_[i]->pid,
                                                        ") did not start serving within 60 s"));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::remove(port_file.c_str());
    job->children_[i]->stub =
        v1::Worker::NewStub(grpc::experimental::CreateCustomChannelWithInterceptors(
            absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(),
            grpc::ChannelArguments(), BearerTokenInterceptors(secret)));
  }
  // A child that could not make its own mount namespace sees the hidden files (a container
  // that forbids namespaces): said once per daemon.
  if (!hidden.paths.empty()) {
    static std::atomic<bool> warned{false};
    char own[64] = {0}, childs[64] = {0};
    const std::string child_ns = absl::StrCat("/proc/", job->children_[0]->pid, "/ns/mnt");
    if (readlink("/proc/self/ns/mnt", own, sizeof(own) - 1) > 0 &&
        readlink(child_ns.c_str(), childs, sizeof(childs) - 1) > 0 &&
        std::string(own) == std::string(childs) && !warned.exchange(true)) {
      LogWarning(
          "rank children can read the worker's token file: no mount namespace could be "
          "made to hide it (a container that forbids them?)",
          {{"file", hidden.paths[0]}});
    }
    unlink(hidden.empty.c_str());
  }
  rmdir(dir.c_str());
  return job;
}

absl::StatusOr<std::unique_ptr<HostedJob>> SpawnedJob::Setup(
    const v1::SetupRequest& request, const WorkerIdentity& identity, const std::string& binary,
    ChildMode mode, v1::SetupResponse* response, CallCanceller* cancel) {
  // One child per device (the range is the spec's, which the service normalized), or one child
  // for the whole job.
  const bool per_device = mode == ChildMode::kOnePerDevice;
  const int n = per_device ? request.spec().trainer().devices() : 1;
  DTRAIN_ASSIGN_OR_RETURN(
      std::unique_ptr<SpawnedJob> job,
      StartChildren(request.job_id(), request.group().token(), identity, binary, n, per_device));
  std::vector<v1::SetupResponse> responses(n);
  DTRAIN_RETURN_IF_ERROR(job->ForEachChild([&](int i, grpc::ClientContext* context) {
    // The same request: as one ddp rank of one device, or as it is.
    v1::SetupRequest child = request;
    if (per_device) {
      child.mutable_spec()->mutable_trainer()->set_strategy("ddp");
      child.mutable_spec()->mutable_trainer()->set_devices(1);
      child.set_spawn_index(i);
    }
    child.set_worker_name(identity.name);
    // Cancelling this call cancels the child's wait for the group in turn.
    CallCanceller::Registration cancellable(cancel, context);
    return job->children_[i]->stub->Setup(context, child, &responses[i]);
  }));
  *response = responses[0];
  response->clear_ranks();
  for (const v1::SetupResponse& r : responses) {
    for (const v1::RankInfo& rank : r.ranks()) *response->add_ranks() = rank;
  }
  return std::unique_ptr<HostedJob>(std::move(job));
}

absl::StatusOr<v1::DryRunResponse> SpawnedJob::DryRun(const v1::DryRunRequest& request,
                                                      const WorkerIdentity& identity,
                                                      const std::string& binary,
                                                      absl::Time deadline) {
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<SpawnedJob> job,
                          StartChildren(request.setup().job_id(), request.setup().group().token(),
                                        identity, binary, 1, /*per_device=*/false));
  v1::DryRunResponse response;
  DTRAIN_RETURN_IF_ERROR(job->Outcome(job->calls_.Run(
      1,
      [&](int, grpc::ClientContext* context) {
        return job->children_[0]->stub->DryRun(context, request, &response);
      },
      kFailureGrace, deadline)));
  return response;  // the child is stopped as `job` goes
}

SpawnedJob::~SpawnedJob() { StopChildren(); }

std::string SpawnedJob::ExitDescription(int i) {
  absl::MutexLock lock(&mu_);
  const Child& c = *children_[i];
  if (!c.exited) return "";
  return absl::StrCat("local rank ", i, " (pid ", c.pid, ") ", DescribeWaitStatus(c.wait_status));
}

absl::Status SpawnedJob::ForEachChild(
    const std::function<grpc::Status(int, grpc::ClientContext*)>& call) {
  return Outcome(calls_.Run(static_cast<int>(children_.size()), call, kFailureGrace));
}

absl::Status SpawnedJob::Outcome(const std::vector<grpc::Status>& results) {
  const int n = static_cast<int>(results.size());
  const bool failed =
      std::any_of(results.begin(), results.end(), [](const grpc::Status& s) { return !s.ok(); });
  if (!failed) return absl::OkStatus();
  // A dead child explains the others' failures: report it first, with its exit status. A
  // broken connection may be seen before the reaper records the exit, so give it a moment.
  for (int i = 0; i < n; ++i) {
    if (results[i].ok()) continue;
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    std::string exited = ExitDescription(i);
    while (exited.empty() && results[i].error_code() == grpc::StatusCode::UNAVAILABLE &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      exited = ExitDescription(i);
    }
    if (!exited.empty()) {
      return absl::AbortedError(absl::StrCat(what_, ": ", exited, "; the job cannot go on"));
    }
  }
  for (const bool skip_cancelled : {true, false}) {
    for (int i = 0; i < n; ++i) {
      if (results[i].ok()) continue;
      if (skip_cancelled && results[i].error_code() == grpc::StatusCode::CANCELLED) continue;
      absl::Status status = FromGrpcStatus(results[i]);
      return absl::Status(status.code(), absl::StrCat("local rank ", i, " (pid ", children_[i]->pid,
                                                      "): ", status.message()));
    }
  }
  return absl::InternalError(absl::StrCat(what_, ": a child failed"));
}

absl::Status SpawnedJob::Step(StepKind kind, const v1::StepRequest& request,
                              v1::StepResponse* response) {
  const int n = static_cast<int>(children_.size());
  if (request.work_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this worker hosts ", n, " ranks; the step carries work for ", request.work_size()));
  }
  // Each child's request is the step's, with its own rank's work only (monitored values and
  // every other field included).
  std::vector<v1::StepRequest> requests(n, request);
  for (int i = 0; n > 1 && i < n; ++i) {
    requests[i].clear_work();
    *requests[i].add_work() = request.work(i);
  }
  std::vector<v1::StepResponse> responses(n);
  // The callback API: no thread hand-off between this call and the child's, on the hot path.
  DTRAIN_RETURN_IF_ERROR(Outcome(calls_.RunAsync(
      n,
      [&](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
        v1::Worker::Stub::async_interface* stub = children_[i]->stub->async();
        switch (kind) {
          case StepKind::kTraining:
            return stub->TrainingStep(context, &requests[i], &responses[i], std::move(done));
          case StepKind::kValidation:
            return stub->ValidationStep(context, &requests[i], &responses[i], std::move(done));
          case StepKind::kTest:
            return stub->TestStep(context, &requests[i], &responses[i], std::move(done));
          case StepKind::kPredict:
            return stub->PredictStep(context, &requests[i], &responses[i], std::move(done));
        }
        done(grpc::Status(grpc::StatusCode::INTERNAL, "unknown step kind"));
      },
      kFailureGrace)));
  for (v1::StepResponse& r : responses) {
    for (v1::LocalResult& result : *r.mutable_results())
      *response->add_results() = std::move(result);
  }
  return absl::OkStatus();
}

absl::Status SpawnedJob::SaveCheckpoint(const std::string& /*path*/,
                                        const v1::SaveCheckpointRequest& request,
                                        v1::SaveCheckpointResponse* response) {
  // Each child resolves the name in the same directory (its Setup named it).
  std::vector<v1::SaveCheckpointResponse> responses(children_.size());
  DTRAIN_RETURN_IF_ERROR(ForEachChild([&](int i, grpc::ClientContext* context) {
    return children_[i]->stub->SaveCheckpoint(context, request, &responses[i]);
  }));
  for (const v1::SaveCheckpointResponse& r : responses) {
    for (bool w : r.written()) response->add_written(w);
    response->set_bytes(std::max(response->bytes(), r.bytes()));
  }
  return absl::OkStatus();
}

absl::Status SpawnedJob::LoadCheckpoint(const v1::LoadCheckpointRequest& request,
                                        v1::LoadCheckpointResponse* response) {
  std::vector<v1::LoadCheckpointResponse> responses(children_.size());
  DTRAIN_RETURN_IF_ERROR(ForEachChild([&](int i, grpc::ClientContext* context) {
    return children_[i]->stub->LoadCheckpoint(context, request, &responses[i]);
  }));
  *response = responses[0];
  return absl::OkStatus();
}

absl::Status SpawnedJob::StateDict(v1::StateDictResponse* response) {
  // Streamed from the child: a state dict may be larger than one message.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kChildStartTimeout));
  v1::StateDictRequest request;
  request.set_job_id(id_);
  auto reader = children_[0]->stub->StreamStateDict(&context, request);
  v1::StateDictChunk chunk;
  while (reader->Read(&chunk)) {
    v1::Tensor& tensor = (*response->mutable_tensors())[chunk.name()];
    if (chunk.has_meta()) *tensor.mutable_meta() = chunk.meta();
    tensor.mutable_data()->append(chunk.data());
  }
  return FromGrpcStatus(reader->Finish());
}

absl::Status SpawnedJob::ReduceBooleanDecision(const v1::DecisionRequest& request,
                                               v1::DecisionResponse* response) {
  const int n = static_cast<int>(children_.size());
  if (request.decisions_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("this worker hosts ", n,
                                                   " ranks; the request carries ",
                                                   request.decisions_size(), " decisions"));
  }
  std::vector<v1::DecisionResponse> responses(n);
  DTRAIN_RETURN_IF_ERROR(ForEachChild([&](int i, grpc::ClientContext* context) {
    v1::DecisionRequest child;
    child.set_job_id(request.job_id());
    child.set_all(request.all());
    child.add_decisions(request.decisions(i));
    return children_[i]->stub->ReduceBooleanDecision(context, child, &responses[i]);
  }));
  response->set_decision(responses[0].decision());
  return absl::OkStatus();
}

absl::Status SpawnedJob::Teardown(bool all_ranks) {
  absl::Status status = ForEachChild([&](int i, grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::TeardownRequest request;
    request.set_job_id(id_);
    request.set_all_ranks(all_ranks);
    v1::TeardownResponse response;
    return children_[i]->stub->Teardown(context, request, &response);
  });
  StopChildren();
  return status;
}

void SpawnedJob::Cancel() {
  // A child's service cancels its running step when the RPC is cancelled.
  calls_.CancelAll();
}

void SpawnedJob::StopChildren() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& c : children_) kill(c->pid, SIGTERM);
  const absl::Time deadline = absl::Now() + kStopGrace;
  for (auto& c : children_) {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (c->exited) break;
      }
      if (absl::Now() > deadline) {
        kill(c->pid, SIGKILL);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  // Every child is waited for by its reaper: none is left a zombie.
  for (auto& c : children_) {
    if (c->reaper.joinable()) c->reaper.join();
  }
}

}  // namespace dtrain

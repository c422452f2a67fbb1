#include "tests/local_cluster.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"

namespace dtrain::testing {

std::string SyntheticDdpJob(const std::string& name, int epochs, int train_size,
                            const std::string& trainer_extra, const std::string& extra) {
  return absl::StrCat("name: ", name, R"(
model: {builtin: mlp}
data:
  synthetic: {train_size: )",
                      train_size, R"(, val_size: 256, test_size: 256, seed: 3}
  batch_size: 32
trainer: {max_epochs: )",
                      epochs, ", strategy: ddp, num_nodes: 2, batches_per_call: 16", trainer_extra,
                      R"(}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05}
)",
                      extra, "\n");
}

LocalCluster::LocalCluster(std::string dir) : dir_(std::move(dir)) {
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
}

LocalCluster::~LocalCluster() { Shutdown(); }

bool LocalCluster::StartCoordinator(const std::string& listen,
                                    const std::vector<std::string>& flags,
                                    const std::vector<std::string>& launcher) {
  const std::string port_file = dir_ + "/coordinator.port";
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = {DTRAIN_COORDINATOR_BIN, "--listen=" + listen,
                                   "--port_file=" + port_file, "--state-dir=" + dir_ + "/state",
                                   "--heartbeat-timeout=5s"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.begin(), launcher.begin(), launcher.end());
  coordinator_ = Subprocess::Start(argv);
  if (coordinator_ == nullptr) return false;
  const int port = WaitForPortFile(port_file, absl::Seconds(20));
  if (port == 0) return false;
  const std::string host = listen.substr(0, listen.rfind(':'));
  address_ = absl::StrCat(host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host, ":", port);
  coordinator_stub_ = v1::Coordinator::NewStub(ConnectToCoordinator(address_));
  workers_stub_ = v1::Workers::NewStub(ConnectToCoordinator(address_));
  jobs_ = v1::Jobs::NewStub(ConnectToCoordinator(address_));
  return true;
}

bool LocalCluster::StopCoordinator(int signal) {
  coordinator_->Kill(signal);
  const bool stopped = coordinator_->Wait(absl::Seconds(15)) != -1;
  if (!stopped) {
    coordinator_->Kill(SIGKILL);
    coordinator_->Wait(absl::Seconds(5));
  }
  coordinator_.reset();
  return stopped;
}

bool LocalCluster::Shutdown() {
  workers_.clear();
  return coordinator_ == nullptr || StopCoordinator(SIGTERM);
}

bool LocalCluster::AddWorker(const std::string& name, const std::vector<std::string>& flags,
                             const std::vector<std::string>& launcher) {
  // Each worker its own artifact cache and job files inside the cluster's directory: tests
  // running at once with the same worker and job names stay apart.
  std::vector<std::string> all = {"--name=" + name, "--threads=1",
                                  absl::StrCat("--cache_dir=", dir_, "/cache-", name),
                                  absl::StrCat("--jobs_dir=", dir_, "/jobs-", name)};
  all.insert(all.end(), flags.begin(), flags.end());
  auto worker = WorkerProcess::Start(address_, all, launcher);
  if (worker == nullptr) return false;
  workers_[name] = std::move(worker);
  return true;
}

std::vector<v1::WorkerInfo> LocalCluster::Workers() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListWorkersResponse response;
  if (!workers_stub_->ListWorkers(&context, {}, &response).ok()) return {};
  return {response.workers().begin(), response.workers().end()};
}

int LocalCluster::AliveWorkers(bool idle_only) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListWorkersResponse response;
  if (!workers_stub_->ListWorkers(&context, {}, &response).ok()) return -1;
  int alive = 0;
  for (const v1::WorkerInfo& w : response.workers()) {
    alive += w.state() == v1::WorkerInfo::ALIVE &&
             (!idle_only || (w.job_id().empty() && w.assigned_job_id().empty()));
  }
  return alive;
}

std::vector<v1::GroupInfo> LocalCluster::Groups() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListGroupsResponse response;
  if (!coordinator_stub_->ListGroups(&context, {}, &response).ok()) return {};
  return {response.groups().begin(), response.groups().end()};
}

v1::JobStatus LocalCluster::GetJob(const std::string& id) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::GetJobRequest request;
  request.set_id(id);
  v1::JobStatus status;
  if (!jobs_->GetJob(&context, request, &status).ok()) return v1::JobStatus();
  return status;
}

CommandResult LocalCluster::Dtrain(const std::string& args, const std::string& env) {
  return RunShell(
      absl::StrCat("DTRAIN_COORDINATOR=", address_, " ", env, " " DTRAIN_CLI_BIN " ", args));
}

std::string LocalCluster::WriteSpec(const std::string& name, const std::string& yaml) {
  const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
  std::ofstream(path) << yaml;
  return path;
}

std::string LocalCluster::Submit(const std::string& name, const std::string& yaml,
                                 const std::string& stage) {
  CommandResult submitted =
      Dtrain(absl::StrCat(stage, " --output json --config ", WriteSpec(name, yaml)));
  // {"id": "<name>-<n>", ...}
  const size_t at = submitted.output.find("\"id\": \"");
  if (submitted.exit_code != 0 || at == std::string::npos) return "";
  const size_t start = at + 7;
  return submitted.output.substr(start, submitted.output.find('"', start) - start);
}

}  // namespace dtrain::testing

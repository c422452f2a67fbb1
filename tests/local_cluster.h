// A local dtrain cluster for end-to-end tests: a dtrain-coordinator process on 127.0.0.1 with a
// state directory of its own, named dtrain-worker processes, the dtrain CLI and stubs to reach
// them. The coordinator can be killed and restarted on the same port and state; every process
// is stopped (workers first) and reaped when the cluster goes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/v1/coordinator.grpc.pb.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "dtrain/v1/workers.grpc.pb.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"

namespace dtrain::testing {

// A 2-worker ddp job spec on synthetic data (MLP, batch 32, seed 1, SGD): `train_size` samples,
// so train_size / 64 optimizer steps per epoch, 16 batches a call (the tests that use it stop,
// kill or drain workers between calls mid-epoch; calls sized by time would reach this fast
// model's epoch end in two); `trainer_extra` adds trainer fields (", k: v")
// and `extra` whole lines (e.g. "checkpoint: {save_top_k: 1}").
std::string SyntheticDdpJob(const std::string& name, int epochs, int train_size = 4096,
                            const std::string& trainer_extra = "", const std::string& extra = "");

class LocalCluster {
 public:
  // `dir` (made empty) holds the coordinator's state and the test's files.
  explicit LocalCluster(std::string dir);
  ~LocalCluster();

  // Starts the coordinator on `listen` ("127.0.0.1:0" picks a port; a restart passes
  // address()), through `launcher` if given (e.g. into a network namespace); false when it did
  // not serve within 20 s. The cluster reaches it at listen's host, or 127.0.0.1 for 0.0.0.0.
  bool StartCoordinator(const std::string& listen = "127.0.0.1:0",
                        const std::vector<std::string>& flags = {},
                        const std::vector<std::string>& launcher = {});
  // Sends `signal` to the coordinator and reaps it (SIGKILL after 15 s); false when it had to be
  // killed.
  bool StopCoordinator(int signal);
  // Stops every worker, then the coordinator with SIGTERM; false when the coordinator did not
  // stop by itself within 15 s.
  bool Shutdown();
  // Starts a worker named `name` (one compute thread) and waits until it serves; `flags` and
  // `launcher` as WorkerProcess::Start's.
  bool AddWorker(const std::string& name, const std::vector<std::string>& flags = {},
                 const std::vector<std::string>& launcher = {});
  WorkerProcess& worker(const std::string& name) { return *workers_.at(name); }

  // Workers the coordinator lists as ALIVE (and, with idle_only, with no job: none reported in
  // their heartbeats, none placed on them and not yet let go); -1 when it
  // does not answer.
  int AliveWorkers(bool idle_only = false);
  // The workers the coordinator lists (empty when it does not answer).
  std::vector<v1::WorkerInfo> Workers();
  // The coordinator's groups (empty when it does not answer).
  std::vector<v1::GroupInfo> Groups();
  // The job's status; a default one (empty id) while the coordinator does not answer.
  v1::JobStatus GetJob(const std::string& id);
  // Runs the dtrain CLI against this cluster (stdout and stderr together); `env` prefixes the
  // command with VAR=value settings (e.g. the client's TLS files).
  CommandResult Dtrain(const std::string& args, const std::string& env = "");
  // Writes `yaml` to <dir>/<name>.yaml; its path.
  std::string WriteSpec(const std::string& name, const std::string& yaml);
  // Writes `yaml` as WriteSpec does and submits it; the job's id ("<name>-1" for the first).
  std::string Submit(const std::string& name, const std::string& yaml,
                     const std::string& stage = "fit");
  // The coordinator's services, for calls the CLI does not make.
  v1::Jobs::Stub& jobs() { return *jobs_; }
  v1::Coordinator::Stub& coordinator() { return *coordinator_stub_; }

  const std::string& dir() const { return dir_; }
  pid_t coordinator_pid() const { return coordinator_->pid(); }
  const std::string& address() const { return address_; }

 private:
  const std::string dir_;
  std::string address_;
  std::unique_ptr<Subprocess> coordinator_;
  std::map<std::string, std::unique_ptr<WorkerProcess>> workers_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
  std::unique_ptr<v1::Workers::Stub> workers_stub_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
};

}  // namespace dtrain::testing

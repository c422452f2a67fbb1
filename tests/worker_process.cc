#include "tests/worker_process.h"
#include "common/channel.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include <grpcpp/create_channel.h>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain::testing {

std::unique_ptr<WorkerProcess> WorkerProcess::Start(const std::string& coordinator,
                                                    std::vector<std::string> extra_flags,
                                                    const std::vector<std::string>& launcher) {
  static std::atomic<int> counter{0};
  const std::string port_file = absl::StrCat(ProcessTempDir(), "/worker-", counter++, ".port");
  std::remove(port_file.c_str());
  std::vector<std::string> argv = {DTRAIN_WORKER_BIN, "--coordinator=" + coordinator,
                                   "--listen=127.0.0.1:0", "--port_file=" + port_file};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  // Tests running at once start clusters of their own on this host, whose workers do not know
  // each other: --cpus=auto would pile them all onto the first cores. A test asks for it.
  if (absl::c_none_of(extra_flags,
                      [](const std::string& f) { return absl::StartsWith(f, "--cpus"); })) {
    argv.push_back("--cpus=none");
  }
  argv.insert(argv.begin(), launcher.begin(), launcher.end());
  auto worker = std::unique_ptr<WorkerProcess>(new WorkerProcess());
  worker->process_ = Subprocess::Start(argv);
  if (worker->process_ == nullptr) return nullptr;
  worker->port_ = WaitForPortFile(port_file, absl::Seconds(30));
  std::remove(port_file.c_str());
  if (worker->port_ == 0) return nullptr;
  // As the coordinator reaches workers: TLS when this process's client TLS is configured.
  worker->stub_ =
      v1::Worker::NewStub(ConnectToCoordinator(absl::StrCat("127.0.0.1:", worker->port_)));
  return worker;
}

int WorkerProcess::Stop(absl::Duration timeout) {
  stopped_ = true;
  process_->Kill(SIGTERM);
  return process_->Wait(timeout);
}

WorkerProcess::~WorkerProcess() {
  if (!stopped_ && process_ != nullptr && Stop() == -1) process_->Kill(SIGKILL);
}

}  // namespace dtrain::testing

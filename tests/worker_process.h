// A dtrain-worker daemon run as a child process for tests: started on 127.0.0.1 with an
// ephemeral port, reached through a Worker stub, stopped with SIGTERM (then SIGKILL) and
// always reaped.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtrain/v1/worker.grpc.pb.h"
#include "tests/test_support.h"

namespace dtrain::testing {

class WorkerProcess {
 public:
  // nullptr when the worker did not serve within 30 s.
  // `launcher` runs before the binary (e.g. {"ip", "netns", "exec", "ns1"}); later flags in
  // `extra_flags` override the defaults (--listen=127.0.0.1:0).
  static std::unique_ptr<WorkerProcess> Start(const std::string& coordinator,
                                              std::vector<std::string> extra_flags = {},
                                              const std::vector<std::string>& launcher = {});
  // SIGTERM, up to 15 s for a clean exit, then SIGKILL.
  ~WorkerProcess();

  v1::Worker::Stub& stub() { return *stub_; }
  pid_t pid() const { return process_->pid(); }
  int port() const { return port_; }
  Subprocess& process() { return *process_; }
  // SIGTERM and the wait status (-1 when it did not exit within `timeout`).
  int Stop(absl::Duration timeout = absl::Seconds(15));

 private:
  std::unique_ptr<Subprocess> process_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace dtrain::testing

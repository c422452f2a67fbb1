// Helpers shared by dtrain's tests: an in-process coordinator on 127.0.0.1:0, ranks run as
// threads, child processes that are always reaped, condition polling with a deadline, and
// scratch paths no other test or process uses.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/process_group.h"
#include "coordinator/coordinator_server.h"

namespace dtrain::testing {

// Timeouts in milliseconds so that failure tests finish quickly.
CoordinatorOptions FastOptions();

// A coordinator serving on 127.0.0.1 with an ephemeral port.
std::unique_ptr<CoordinatorServer> StartCoordinator(CoordinatorOptions options = FastOptions());

ProcessGroupOptions GroupOptions(const std::string& group, int world_size,
                                 const std::string& host = "");

// Joins `threads` ranks (default: all `world_size`) of a group in threads, host "host-<i>"
// unless `customize` says otherwise, and runs `body` on each with the rank's group. Returns
// the statuses by rank (world_size slots); a join failure is reported in thread i's slot.
std::vector<absl::Status> RunRanks(
    const std::string& address, const std::string& group, int world_size,
    const std::function<absl::Status(ProcessGroup&)>& body,
    const std::function<void(ProcessGroupOptions&, int index)>& customize = nullptr,
    int threads = -1);

// Polls `condition` until it holds or `timeout` passes; returns whether it held.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout);

// The port a server wrote to `path` (its --port_file) once serving; 0 after `timeout`.
int WaitForPortFile(const std::string& path, absl::Duration timeout);

// A loopback port that was free a moment ago (0 if none could be had), for servers that
// cannot listen on port 0 and report the port they got (nginx): their caller retries with
// another when it clashed meanwhile.
int PickFreePort();

// A directory this process alone uses, under ::testing::TempDir(): made by mkdtemp
// (dtrain-<pid>-XXXXXX) on first use and removed, with everything in it, when the process
// exits. Thread-safe.
const std::string& ProcessTempDir();
// <ProcessTempDir()>/<Suite>.<Test>-<name>: a path of the running test's own, so that a file
// left by another test, another run or another user cannot change what the test sees.
std::string TestTempPath(const std::string& name);

// A child process, started with fork+exec; killed and reaped on destruction.
class Subprocess {
 public:
  // Starts argv[0] with the arguments; stdout goes to a pipe readable with ReadLine.
  static std::unique_ptr<Subprocess> Start(const std::vector<std::string>& argv);
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // The next line of the child's stdout, or "" at EOF or after `timeout`.
  std::string ReadLine(absl::Duration timeout);
  void Kill(int signal);
  // Waits for exit; returns the raw wait status, or -1 after `timeout`.
  int Wait(absl::Duration timeout);

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::string buffered_;
};

// A shell command's exit code and its stdout and stderr together.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunShell(const std::string& command);
// Runs `script`, after `import torch`, with Debian's python3 and its torch (python3-torch).
CommandResult RunTorchPython(const std::string& script);
// Python defining weights_only_load(path): torch.load refusing every global that torch's
// weights_only=True refuses (its default since torch 2.6), so that a test shows what users of a
// current torch load by default. Debian's torch 1.13 has weights_only too, but its unpickler
// lacks opcodes later ones read (floats), which every checkpoint holds; this one checks the
// globals and reads the opcodes. For RunTorchPython scripts.
extern const char kWeightsOnlyLoad[];

// A file's whole contents; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// The Cpus_allowed_list of a /proc status file (/proc/self/status, /proc/<pid>/task/<tid>/status):
// the cores that process or thread may run on, as "0-1,4"; "" when it cannot be read.
std::string CpusAllowedList(const std::string& status_file);

// VmRSS of a process, in KiB.
long ResidentKiB(pid_t pid);

}  // namespace dtrain::testing

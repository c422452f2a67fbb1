#include "tests/test_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"

namespace dtrain::testing {

CoordinatorOptions FastOptions() {
  CoordinatorOptions options;
  options.listen_address = "127.0.0.1:0";
  // A state directory of each coordinator's own, under this test process's.
  static std::atomic<int> coordinators{0};
  options.state_dir = absl::StrCat(ProcessTempDir(), "/coordinator-state-", coordinators++);
  options.tick = absl::Milliseconds(10);
  options.groups.heartbeat_interval = absl::Milliseconds(100);
  // 2 s, not less: in CI, a test beside a CPU-heavy one had a healthy rank's heartbeats held
  // up for 1.1 s.
  options.groups.heartbeat_timeout = absl::Milliseconds(2000);
  options.groups.default_collective_timeout = absl::Seconds(60);
  options.groups.default_register_timeout = absl::Seconds(30);
  return options;
}

std::unique_ptr<CoordinatorServer> StartCoordinator(CoordinatorOptions options) {
  auto server = CoordinatorServer::Start(std::move(options));
  if (!server.ok()) return nullptr;
  return std::move(*server);
}

ProcessGroupOptions GroupOptions(const std::string& group, int world_size,
                                 const std::string& host) {
  ProcessGroupOptions options;
  options.group = group;
  options.world_size = world_size;
  options.host = host;
  options.register_timeout = absl::Seconds(30);
  return options;
}

std::vector<absl::Status> RunRanks(
    const std::string& address, const std::string& group, int world_size,
    const std::function<absl::Status(ProcessGroup&)>& body,
    const std::function<void(ProcessGroupOptions&, int index)>& customize, int thread_count) {
  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  absl::Mutex mu;
  if (thread_count < 0) thread_count = world_size;
  for (int i = 0; i < thread_count; ++i) {
    threads.emplace_back([&, i] {
      ProcessGroupOptions options = GroupOptions(group, world_size, absl::StrCat("host-", i));
      if (customize) customize(options, i);
      absl::Status status;
      int rank = i;
      auto pg = ProcessGroup::Join(address, options);
      if (!pg.ok()) {
        status = pg.status();
      } else {
        rank = (*pg)->rank();
        status = body(**pg);
      }
      absl::MutexLock lock(&mu);
      if (!statuses[rank].ok()) return;  // keep the first report for this slot
      statuses[rank] = status;
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

int WaitForPortFile(const std::string& path, absl::Duration timeout) {
  int port = 0;
  WaitFor(
      [&] {
        std::ifstream in(path);
        return static_cast<bool>(in >> port) && port > 0;
      },
      timeout);
  return port;
}

namespace {

// Removes its directory when the process exits normally (gtest_main returns from main).
class ProcessTempDirectory {
 public:
  ProcessTempDirectory() {
    std::string pattern = absl::StrCat(::testing::TempDir(), "/dtrain-", getpid(), "-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "cannot make a scratch directory %s: %s\n", pattern.c_str(),
                   std::strerror(errno));
      std::abort();
    }
    path_ = pattern;
  }
  ~ProcessTempDirectory() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

const std::string& ProcessTempDir() {
  static const ProcessTempDirectory directory;
  return directory.path();
}

std::string TestTempPath(const std::string& name) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  // Parameterised names hold '/' (Suite/Name.Case/0): one path component each.
  std::string who =
      test == nullptr ? "no-test" : absl::StrCat(test->test_suite_name(), ".", test->name());
  std::replace(who.begin(), who.end(), '/', '_');
  return absl::StrCat(ProcessTempDir(), "/", who, "-", name);
}

std::unique_ptr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The child dies with the test process.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return nullptr;
  }
  auto p = std::unique_ptr<Subprocess>(new Subprocess());
  p->pid_ = pid;
  p->stdout_fd_ = fds[0];
  return p;
}

Subprocess::~Subprocess() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string Subprocess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return "";
    pollfd pfd{stdout_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left)) <= 0) return "";
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof buf);
    if (n <= 0) return "";
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

void Subprocess::Kill(int signal) {
  if (!reaped_) kill(pid_, signal);
}

int Subprocess::Wait(absl::Duration timeout) {
  if (reaped_) return wait_status_;
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < deadline) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      wait_status_ = status;
      return status;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string CpusAllowedList(const std::string& status_file) {
  std::ifstream status(status_file);
  constexpr char kKey[] = "Cpus_allowed_list:";
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(kKey, 0) != 0) continue;
    const size_t value = line.find_first_not_of(" \t", sizeof(kKey) - 1);
    return value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

CommandResult RunShell(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

const char kWeightsOnlyLoad[] = R"(
import pickle, types
class _WeightsOnlyUnpickler(pickle.Unpickler):
    # torch.load resolves storage types itself; a global that reaches here is what REDUCE calls.
    def find_class(self, module, name):
        if (module, name) not in {("torch._utils", "_rebuild_tensor_v2"),
                                  ("collections", "OrderedDict")}:
            raise pickle.UnpicklingError(f"weights_only refuses the global {module}.{name}")
        return super().find_class(module, name)
_weights_only_pickle = types.ModuleType("weights_only_pickle")
_weights_only_pickle.Unpickler = _WeightsOnlyUnpickler
_weights_only_pickle.load = lambda f, **kw: _WeightsOnlyUnpickler(f, **kw).load()
def weights_only_load(path):
    return torch.load(path, map_location="cpu", pickle_module=_weights_only_pickle)
)";

CommandResult RunTorchPython(const std::string& script) {
  const std::string path = TestTempPath("script.py");
  std::ofstream(path) << "import torch\n" << script;
  return RunShell("/usr/bin/python3 " + path);
}

long ResidentKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace dtrain::testing

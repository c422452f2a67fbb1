#include "tests/network_namespaces.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain::testing {
namespace {

// 10.<200..249>: one range per test process, so tests running in parallel never share one:
// two processes with the same range would each add a route to the same /24 in this namespace,
// and the replies to one test's hosts would leave through the other test's link (its workers
// then cannot reach their coordinator). A range is this process's while it holds an flock on
// the range's lock file (the kernel lets go when the process ends, however it ends), and it
// must not be on any interface already (a test killed before its clean-up leaves its links).
// Chosen once, starting from the pid so parallel tests rarely try the same one first.
std::string Prefix() {
  static const std::string prefix = [] {
    const std::string in_use = RunShell("ip -4 -o addr show 2>&1").output;
    for (int i = 0; i < 50; ++i) {
      const int second = 200 + (getpid() + i) % 50;
      const std::string lock = absl::StrCat("/tmp/dtrain-test-net-10.", second, ".lock");
      const int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        continue;
      }
      if (absl::StrContains(in_use, absl::StrCat(" 10.", second, "."))) {
        close(fd);
        continue;
      }
      return absl::StrCat("10.", second);  // fd stays open: the lock is held until exit
    }
    return absl::StrCat("10.", 200 + getpid() % 50);  // all 50 taken: the old rule
  }();
  return prefix;
}
std::string Tag() { return absl::StrCat(getpid() % 100000); }

}  // namespace

NetworkNamespace::NetworkNamespace(int index)
    : index_(index),
      name_(absl::StrCat("dtrain", getpid(), "-", index)),
      here_(absl::StrCat("dt", Tag(), "h", index)),
      there_(absl::StrCat("dt", Tag(), "t", index)) {}

std::unique_ptr<NetworkNamespace> NetworkNamespace::Make(int index, std::string* error) {
  auto ns = std::unique_ptr<NetworkNamespace>(new NetworkNamespace(index));
  const std::string& n = ns->name_;
  CommandResult made = RunShell(absl::StrCat(
      "set -e; ip netns add ", n, "; ip link add ", ns->here_, " type veth peer name ", ns->there_,
      "; ip link set ", ns->there_, " netns ", n, "; ip addr add ", ns->gateway(), "/24 dev ",
      ns->here_, "; ip link set ", ns->here_, " up; ip netns exec ", n, " ip addr add ",
      ns->address(), "/24 dev ", ns->there_, "; ip netns exec ", n, " ip link set ", ns->there_,
      " up; ip netns exec ", n, " ip link set lo up; ip netns exec ", n,
      " ip route add default via ", ns->gateway(), " 2>&1"));
  if (made.exit_code != 0) {
    *error = made.output;
    return nullptr;
  }
  return ns;
}

NetworkNamespace::~NetworkNamespace() {
  RunShell(
      absl::StrCat("ip link del ", here_, " 2>/dev/null; ip netns del ", name_, " 2>/dev/null"));
}

std::string NetworkNamespace::address() const { return absl::StrCat(Prefix(), ".", index_, ".2"); }
std::string NetworkNamespace::gateway() const { return absl::StrCat(Prefix(), ".", index_, ".1"); }

std::vector<std::string> NetworkNamespace::launcher() const {
  // env finds ip on the PATH (Subprocess execs a path, not a name). A host name of its own (a
  // UTS namespace), as a separate machine has: ranks that share a host name and boot share
  // memory (the shm plane), which ranks on two machines cannot.
  const std::string become = absl::StrCat("hostname ", name_, " && exec \"$0\" \"$@\"");
  return {"/usr/bin/env", "ip", "netns", "exec", name_, "unshare", "--uts", "sh", "-c", become};
}

bool NetworkNamespace::SetLink(bool up) {
  return RunShell(absl::StrCat("ip link set ", here_, up ? " up" : " down")).exit_code == 0;
}

CommandResult NetworkNamespace::Netem(const std::string& args) {
  return RunShell(absl::StrCat("tc qdisc add dev ", here_, " root netem ", args,
                               " 2>&1 && ip netns exec ", name_, " tc qdisc add dev ", there_,
                               " root netem ", args, " 2>&1"));
}

std::unique_ptr<BridgedHosts> BridgedHosts::Make(int count, std::string* error) {
  auto hosts = std::unique_ptr<BridgedHosts>(new BridgedHosts());
  hosts->bridge_ = absl::StrCat("dtbr", Tag());
  std::string script =
      absl::StrCat("set -e; ip link add ", hosts->bridge_, " type bridge; ip addr add ", Prefix(),
                   ".100.254/24 dev ", hosts->bridge_, "; ip link set ", hosts->bridge_, " up");
  for (int i = 0; i < count; ++i) {
    const std::string ns = absl::StrCat("dtrain", getpid(), "-host", i);
    const std::string here = absl::StrCat("dt", Tag(), "b", i),
                      there = absl::StrCat("dt", Tag(), "n", i);
    absl::StrAppend(&script, "; ip netns add ", ns, "; ip link add ", here, " type veth peer name ",
                    there, "; ip link set ", here, " master ", hosts->bridge_, "; ip link set ",
                    here, " up; ip link set ", there, " netns ", ns, "; ip netns exec ", ns,
                    " ip addr add ", hosts->address(i), "/24 dev ", there, "; ip netns exec ", ns,
                    " ip link set ", there, " up; ip netns exec ", ns, " ip link set lo up");
    hosts->count_ = i + 1;  // what the destructor removes, even if a later step fails
  }
  CommandResult made = RunShell(script + " 2>&1");
  if (made.exit_code != 0) {
    *error = made.output;
    return nullptr;
  }
  return hosts;
}

BridgedHosts::~BridgedHosts() {
  std::string script;
  for (int i = 0; i < count_; ++i) {
    absl::StrAppend(&script, "ip link del dt", Tag(), "b", i, " 2>/dev/null; ip netns del dtrain",
                    getpid(), "-host", i, " 2>/dev/null; ");
  }
  RunShell(absl::StrCat(script, "ip link del ", bridge_, " 2>/dev/null; true"));
}

std::string BridgedHosts::address(int host) const {
  return absl::StrCat(Prefix(), ".100.", host + 1);
}

std::vector<std::string> BridgedHosts::launcher(int host, const std::string& hostname,
                                                const std::vector<std::string>& hidden) const {
  // sh sets the host name in a fresh UTS namespace, then becomes the program ("$0" "$@"). With
  // directories to hide, a fresh mount namespace (private: nothing leaks back) gets an empty
  // tmpfs over each, so the host sees none of their files, as a separate machine would not.
  std::string script = absl::StrCat("hostname ", hostname);
  for (const std::string& dir : hidden) {
    absl::StrAppend(&script, " && mount -t tmpfs dtrain-elsewhere '", dir, "'");
  }
  absl::StrAppend(&script, " && exec \"$0\" \"$@\"");
  std::vector<std::string> argv = {
      "/usr/bin/env", "ip",   "netns", "exec", absl::StrCat("dtrain", getpid(), "-host", host),
      "unshare",      "--uts"};
  if (!hidden.empty()) {
    argv.insert(argv.end(), {"--mount", "--propagation", "private"});
  }
  argv.insert(argv.end(), {"sh", "-c", script});
  return argv;
}

}  // namespace dtrain::testing

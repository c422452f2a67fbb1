// Test "hosts" made of Linux network namespaces, for tests of what crosses a network: made by
// the test itself with iproute2 (ip netns, veth, a bridge), removed when it ends. Making them
// needs root; Make reports why it could not, and the test skips saying so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace dtrain::testing {

// One namespace with a veth pair to this test's namespace: <prefix>.<index>.1 here,
// <prefix>.<index>.2 there, routed both ways.
class NetworkNamespace {
 public:
  static std::unique_ptr<NetworkNamespace> Make(int index, std::string* error);
  ~NetworkNamespace();

  std::string address() const;  // inside
  std::string gateway() const;  // this side
  // Runs a program inside (prepended to its argv), with a host name of its own.
  std::vector<std::string> launcher() const;
  bool SetLink(bool up);
  // Adds a netem qdisc with `args` on both ends of the pair.
  CommandResult Netem(const std::string& args);

 private:
  explicit NetworkNamespace(int index);
  const int index_;
  const std::string name_, here_, there_;
};

// `count` namespaces on one bridge, each with an address on <prefix>.100.0/24 and a host name
// of its own (UTS namespace), as separate machines on one LAN would be; this test's namespace
// has an address on the bridge too, so the test reaches every host.
class BridgedHosts {
 public:
  static std::unique_ptr<BridgedHosts> Make(int count, std::string* error);
  ~BridgedHosts();

  std::string address(int host) const;
  // Runs a program inside `host`'s namespace with host name `hostname`; the directories in
  // `hidden` are empty there (a mount namespace of its own with a tmpfs over each).
  std::vector<std::string> launcher(int host, const std::string& hostname,
                                    const std::vector<std::string>& hidden = {}) const;

 private:
  BridgedHosts() = default;
  int count_ = 0;
  std::string bridge_;
};

}  // namespace dtrain::testing

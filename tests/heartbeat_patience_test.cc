// A group's members and a coordinator that stops answering (SIGSTOP: the TCP connection stays
// up, nothing answers on it). Heartbeats answered late or not at all for less than the heartbeat
// timeout leave every member's health OK, so collectives that consult it (Gloo's, shared
// memory's) carry on; once the coordinator has been silent for the timeout, every member's
// health names it.
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/process_group.h"
#include "tests/local_cluster.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace heartbeat_patience_test {

using ::testing::HasSubstr;

// Continues the coordinator however the test ends, so the cluster can stop and reap it.
class Frozen {
 public:
  explicit Frozen(pid_t pid) : pid_(pid) { frozen_ = kill(pid_, SIGSTOP) == 0; }
  ~Frozen() { Thaw(); }
  bool ok() const { return frozen_; }
  void Thaw() {
    if (frozen_) kill(pid_, SIGCONT);
    frozen_ = false;
  }

 private:
  pid_t pid_;
  bool frozen_ = false;
};

TEST(HeartbeatPatience, CoordinatorSilentBelowThenPastTheTimeout_HealthOkThenUnavailable) {
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/heartbeat-patience-", getpid()));
  // Heartbeats every 100 ms, each given up to 500 ms; members declared dead after 2 s without
  // one.
  ASSERT_TRUE(cluster.StartCoordinator("127.0.0.1:0",
                                       {"--heartbeat_interval=100ms", "--heartbeat_timeout=2s"}));
  std::unique_ptr<ProcessGroup> ranks[2];
  absl::Status joined[2];
  {
    std::thread second([&] {
      auto pg = ProcessGroup::Join(cluster.address(), GroupOptions("patience", 2, "host-1"));
      joined[1] = pg.status();
      if (pg.ok()) ranks[1] = std::move(*pg);
    });
    auto pg = ProcessGroup::Join(cluster.address(), GroupOptions("patience", 2, "host-0"));
    joined[0] = pg.status();
    if (pg.ok()) ranks[0] = std::move(*pg);
    second.join();
  }
  ASSERT_TRUE(joined[0].ok()) << joined[0];
  ASSERT_TRUE(joined[1].ok()) << joined[1];
  auto barrier = [&](const std::string& name) {
    absl::Status other;
    std::thread second([&] { other = ranks[1]->Barrier(name); });
    absl::Status mine = ranks[0]->Barrier(name);
    second.join();
    return mine.ok() ? other : mine;
  };
  ASSERT_TRUE(barrier("before").ok());

  // Silent for 1 s, half the timeout: the heartbeats in flight go unanswered.
  {
    Frozen frozen(cluster.coordinator_pid());
    ASSERT_TRUE(frozen.ok());
    const absl::Time until = absl::Now() + absl::Seconds(1);
    int polls = 0;
    while (absl::Now() < until) {
      for (auto& rank : ranks) {
        absl::Status health = rank->health();
        ASSERT_TRUE(health.ok()) << "rank " << rank->rank() << " after " << polls
                                 << " polls: " << health;
      }
      ++polls;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  // The group carries on: a collective through the coordinator, and health after it.
  absl::Status after = barrier("after a short silence");
  EXPECT_TRUE(after.ok()) << after;
  absl::SleepFor(absl::Milliseconds(300));
  for (auto& rank : ranks) EXPECT_TRUE(rank->health().ok()) << rank->health();

  // Silent past the timeout: every member says so, naming the coordinator, within the timeout
  // plus a heartbeat's interval and deadline (and scheduling slack on a loaded machine).
  Frozen frozen(cluster.coordinator_pid());
  ASSERT_TRUE(frozen.ok());
  const absl::Time stopped = absl::Now();
  absl::Status verdict[2];
  absl::Duration took[2];
  while (absl::Now() - stopped < absl::Seconds(15) && (verdict[0].ok() || verdict[1].ok())) {
    for (int r = 0; r < 2; ++r) {
      if (!verdict[r].ok()) continue;
      verdict[r] = ranks[r]->health();
      took[r] = absl::Now() - stopped;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  frozen.Thaw();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(verdict[r].code(), absl::StatusCode::kUnavailable) << "rank " << r << verdict[r];
    EXPECT_THAT(verdict[r].message(),
                HasSubstr(absl::StrCat("the coordinator at ", cluster.address(),
                                       " has answered no heartbeat for")));
    EXPECT_THAT(verdict[r].message(), HasSubstr("heartbeat timeout 2s"));
    // The last answer came at most an interval before the freeze.
    EXPECT_GE(took[r], absl::Milliseconds(1500)) << "rank " << r;
    EXPECT_LT(took[r], absl::Seconds(6)) << "rank " << r;
    std::printf("rank %d: the silent coordinator reported after %s: %s\n", r,
                absl::FormatDuration(took[r]).c_str(), verdict[r].ToString().c_str());
  }
}

}  // namespace heartbeat_patience_test
}  // namespace dtrain::testing

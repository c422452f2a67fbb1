// A watching client and a coordinator that freezes (SIGSTOP: the kernel still holds the TCP
// connection, nothing answers on it) once the watch has gone quiet: `dtrain watch` ends with an
// error within the channel's keepalive instead of waiting forever. gRPC stops a client's pings
// after two without data of its own, and a watch sends nothing after its request: the freeze
// comes after those two pings (10 s apart), where only a client told to keep pinging notices it.
#include <signal.h>
#include <unistd.h>

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace watch_keepalive_test {

using ::testing::HasSubstr;

TEST(WatchKeepalive, CoordinatorFrozenAfterTheWatchWentQuiet_WatchEndsWithAnError) {
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/watch-keepalive-", getpid()));
  ASSERT_TRUE(cluster.StartCoordinator());
  // No worker: the job stays queued, and its status does not change while it is watched.
  const std::string id = cluster.Submit("idle", SyntheticDdpJob("idle", 1, 512));
  ASSERT_FALSE(id.empty());
  CommandResult watched;
  absl::Notification ended;
  // `timeout` ends a watch that never notices, so the test cannot hang on the defect it checks.
  std::thread watcher([&] {
    watched = RunShell(absl::StrCat("timeout -s KILL 90 env DTRAIN_COORDINATOR=", cluster.address(),
                                    " " DTRAIN_CLI_BIN " watch ", id, " 2>&1"));
    ended.Notify();
  });
  absl::SleepFor(absl::Seconds(25));
  EXPECT_FALSE(ended.HasBeenNotified()) << watched.output;
  ASSERT_EQ(kill(cluster.coordinator_pid(), SIGSTOP), 0);
  const absl::Time frozen = absl::Now();
  const bool noticed = ended.WaitForNotificationWithTimeout(absl::Seconds(40));
  const absl::Duration took = absl::Now() - frozen;
  kill(cluster.coordinator_pid(), SIGCONT);
  watcher.join();
  ASSERT_TRUE(noticed) << "the watch did not notice the frozen coordinator in 40 s";
  // The next ping within 10 s, its answer awaited 5 s.
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_NE(watched.exit_code, 0) << watched.output;
  EXPECT_NE(watched.exit_code, 137) << "killed by timeout: " << watched.output;
  EXPECT_THAT(watched.output, HasSubstr("idle-1 QUEUED"));
  EXPECT_THAT(watched.output,
              HasSubstr(absl::StrCat("lost the coordinator at ", cluster.address(),
                                     " while watching job idle-1 (keepalive watchdog timeout)")));
  std::printf("frozen coordinator noticed after %s: %s\n", absl::FormatDuration(took).c_str(),
              watched.output.c_str());
}

}  // namespace watch_keepalive_test
}  // namespace dtrain::testing

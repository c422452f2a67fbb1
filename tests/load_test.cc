// Scale on a small machine: 64 ranks (threads, one connection each) in one group run 1,000
// barriers and 100 all_reduce of 1 MiB through a dtrain-coordinator process; nothing fails and
// the coordinator's resident memory afterwards is within 10% of its level before.
#include <unistd.h>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace load_test {

// The coordinator gives freed memory back once traffic has paused for 200 ms. Reads its RSS
// after such a pause (and, when `at_most` is given, polls up to 5 s for it to fall that low).
long QuietResidentKiB(pid_t pid, long at_most = 0) {
  absl::SleepFor(absl::Milliseconds(500));
  long rss = ResidentKiB(pid);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (at_most > 0 && rss > at_most && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    rss = ResidentKiB(pid);
  }
  return rss;
}

TEST(Load, SixtyFourRanks_ThousandBarriersHundredAllReduces_MemoryReturns) {
  const std::string port_file = TestTempPath("coordinator.port");
  auto coordinator =
      Subprocess::Start({DTRAIN_COORDINATOR_BIN, "--listen=127.0.0.1:0", "--port_file=" + port_file,
                         "--heartbeat-timeout=30s", "--state-dir=" + TestTempPath("state")});
  ASSERT_NE(coordinator, nullptr);
  const int port = WaitForPortFile(port_file, absl::Seconds(10));
  ASSERT_GT(port, 0) << "the coordinator wrote no port";
  const std::string address = absl::StrCat("127.0.0.1:", port);

  constexpr int kRanks = 64;
  constexpr int kBarriers = 1000;
  constexpr int kAllReduces = 100;
  constexpr int kWarmUps = 10;
  const int64_t kElements = (1 << 20) / 4;  // 1 MiB of float32
  absl::Mutex mu;
  long rss_idle = 0, rss_before = 0, rss_after = 0;
  const long idle = ResidentKiB(coordinator->pid());
  int arrived = 0;
  auto statuses = RunRanks(address, "load", kRanks, [&](ProcessGroup& pg) -> absl::Status {
    // Warm up every connection and code path (gRPC sizes its flow-control windows and buffers
    // to the traffic it sees), then measure from that steady state.
    HostTensor t = HostTensor::Zeros(v1::DTYPE_FLOAT32, {kElements}).value();
    reinterpret_cast<float*>(t.data.data())[0] = static_cast<float>(pg.rank());
    for (int i = 0; i < kWarmUps; ++i) {
      if (auto r = pg.AllReduce(t, v1::REDUCE_OP_SUM); !r.ok()) return r.status();
    }
    if (absl::Status s = pg.Barrier("warm"); !s.ok()) return s;
    if (pg.rank() == 0) {
      rss_idle = idle;
      rss_before = QuietResidentKiB(coordinator->pid());
    }
    if (absl::Status s = pg.Barrier("measured"); !s.ok()) return s;
    for (int i = 0; i < kBarriers; ++i) {
      if (absl::Status s = pg.Barrier("b"); !s.ok()) return s;
    }
    for (int i = 0; i < kAllReduces; ++i) {
      auto r = pg.AllReduce(t, v1::REDUCE_OP_SUM);
      if (!r.ok()) return r.status();
      // 0 + 1 + ... + 63 in element 0, zeros elsewhere.
      const float* p = reinterpret_cast<const float*>(r->data.data());
      if (p[0] != 2016.0f || p[kElements - 1] != 0.0f) {
        return absl::InternalError(absl::StrCat("wrong sum ", p[0]));
      }
    }
    if (absl::Status s = pg.Barrier("done"); !s.ok()) return s;
    if (pg.rank() == 0) rss_after = QuietResidentKiB(coordinator->pid(), rss_before * 11 / 10);
    absl::MutexLock lock(&mu);
    ++arrived;
    return absl::OkStatus();
  });
  for (int r = 0; r < kRanks; ++r)
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  EXPECT_EQ(arrived, kRanks);
  ASSERT_GT(rss_before, 0);
  std::printf(
      "coordinator RSS idle %ld KiB, after warm-up %ld KiB, after the load %ld KiB "
      "(%+.1f%%)\n",
      rss_idle, rss_before, rss_after, 100.0 * (rss_after - rss_before) / rss_before);
  EXPECT_LE(rss_after, rss_before * 11 / 10);
  // Stronger than the promise: with all 64 connections still open, what stays above the level
  // of a coordinator that never saw a rank is less than two 1 MiB payloads per rank, the input
  // and the result a rank's all_reduce holds at the coordinator. Measured: ~40 MiB usually and
  // 69 MiB once (malloc's arenas keep freed payloads), the same after 300 all_reduces as after
  // 100, so nothing grows per operation; the 10% check above is the one that catches growth.
  EXPECT_LE(rss_after, rss_idle + kRanks * 2 * 1024);
  coordinator->Kill(SIGTERM);
  const int status = coordinator->Wait(absl::Seconds(10));
  ASSERT_NE(status, -1) << "coordinator did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace load_test
}  // namespace dtrain::testing

// No silent hang: mismatched calls, late ranks, killed and hung members, clean leaves and a
// coordinator shutdown each end every waiting rank's call with an error that names who.
#include <signal.h>

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace failure_test {

using ::testing::HasSubstr;

HostTensor Floats(int64_t n) { return HostTensor::Zeros(v1::DTYPE_FLOAT32, {n}).value(); }

TEST(Mismatch, DifferentShapes_AllRanksGetFailedPreconditionNamingEachCall) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<std::string> messages(3);
  absl::Mutex mu;
  auto statuses = RunRanks(coordinator->address(), "mismatch", 3, [&](ProcessGroup& pg) {
    auto r = pg.AllReduce(Floats(pg.rank() == 2 ? 5 : 4), v1::REDUCE_OP_SUM);
    {
      absl::MutexLock lock(&mu);
      messages[pg.rank()] = std::string(r.status().message());
    }
    if (r.status().code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError("expected FAILED_PRECONDITION, got " + r.status().ToString());
    }
    // The mismatch is reported, not fatal: the next collective works.
    return pg.Barrier("after-mismatch");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_THAT(messages[r], HasSubstr("all_reduce(float32[4], sum)"));
    EXPECT_THAT(messages[r], HasSubstr("all_reduce(float32[5], sum)"));
    EXPECT_THAT(messages[r], HasSubstr("rank 2"));
  }
}

TEST(Mismatch, DifferentOpsSrcAndReduceOp_AreAllDetected) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto statuses = RunRanks(coordinator->address(), "mismatch-kinds", 2, [&](ProcessGroup& pg) {
    const bool odd = pg.rank() == 1;
    HostTensor t = Floats(3);
    absl::Status a = odd ? pg.Barrier("x") : pg.AllReduce(t, v1::REDUCE_OP_SUM).status();
    absl::Status b = pg.Broadcast(odd ? 1 : 0, &t).status();
    absl::Status c = pg.AllReduce(t, odd ? v1::REDUCE_OP_MAX : v1::REDUCE_OP_SUM).status();
    absl::Status d = pg.Reduce(t, v1::REDUCE_OP_SUM, odd ? 0 : 1).status();
    absl::Status e = pg.Barrier(odd ? "left" : "right");
    absl::Status f = pg.ReduceBooleanDecision(true, /*all=*/odd).status();
    for (const absl::Status& s : {a, b, c, d, e, f}) {
      if (s.code() != absl::StatusCode::kFailedPrecondition ||
          !absl::StrContains(s.message(), "does not match")) {
        return absl::InternalError("expected a mismatch, got " + s.ToString());
      }
    }
    if (!absl::StrContains(a.message(), "barrier('x')") ||
        !absl::StrContains(b.message(), "broadcast(src=1, tensor)") ||
        !absl::StrContains(c.message(), "max") || !absl::StrContains(d.message(), "dst=1") ||
        !absl::StrContains(e.message(), "barrier('left')") ||
        !absl::StrContains(f.message(), "all=false")) {
      return absl::InternalError(absl::StrCat("message lacks the other call: ", a.message(), " | ",
                                              b.message(), " | ", c.message()));
    }
    return pg.Barrier("still-works");
  });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(Deadline, MissingRank_DeadlineExceededNamesIt) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  absl::Notification early_done;
  std::vector<absl::Status> results(3);
  std::vector<absl::Duration> waited(3);
  absl::Mutex mu;
  RunRanks(coordinator->address(), "deadline", 3, [&](ProcessGroup& pg) {
    if (pg.rank() == 2) early_done.WaitForNotification();  // arrives after the deadline
    const absl::Time start = absl::Now();
    absl::Status s = pg.Barrier("slow", {absl::Milliseconds(300)});
    absl::MutexLock lock(&mu);
    results[pg.rank()] = s;
    waited[pg.rank()] = absl::Now() - start;
    if (pg.rank() == 0) early_done.Notify();
    return absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("missing: rank 2 (host host-2)"));
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("2 of 3 ranks arrived"));
  }
  EXPECT_GE(waited[0], absl::Milliseconds(290));
  EXPECT_LT(waited[0], absl::Seconds(5));
}

// A member in its own process is SIGKILLed while the survivors (threads) use the group.
class MemberDiesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MemberDiesTest, SurvivorsGetNamedErrorWithinHeartbeatTimeout) {
  const std::string action = GetParam();
  auto coordinator = StartCoordinator();  // heartbeat timeout 2 s
  ASSERT_NE(coordinator, nullptr);
  const std::string group = "dies-" + action;
  auto victim = Subprocess::Start({DTRAIN_TEST_RANK_BIN, "--coordinator=" + coordinator->address(),
                                   "--group=" + group, "--world_size=3", "--host=zz-victim",
                                   "--action=" + action});
  ASSERT_NE(victim, nullptr);

  absl::Notification killed;
  absl::Notification first_answered;
  absl::Time kill_time = absl::InfiniteFuture();
  std::vector<absl::Status> first(2), second(2);
  std::vector<absl::Time> when(2);
  absl::Mutex mu;
  std::thread survivors([&] {
    RunRanks(
        coordinator->address(), group, 3,
        [&](ProcessGroup& pg) {
          // hosts host-0 < host-1 < zz-victim: the victim is rank 2.
          auto call = [&]() -> absl::Status {
            if (action == "all_reduce")
              return pg.AllReduce(Floats(1 << 20), v1::REDUCE_OP_SUM).status();
            return pg.Barrier("doomed");
          };
          if (pg.rank() == 1 || action == "idle") killed.WaitForNotification();
          absl::Status a = call();
          if (pg.rank() == 0) first_answered.Notify();
          absl::Status b = pg.Barrier("after");
          absl::MutexLock lock(&mu);
          first[pg.rank()] = a;
          second[pg.rank()] = b;
          when[pg.rank()] = absl::Now();
          return absl::OkStatus();
        },
        nullptr, /*threads=*/2);
  });
  // Whatever happens below, the victim is killed and reaped and the survivors are joined.
  auto cleanup = absl::MakeCleanup([&] {
    victim->Kill(SIGKILL);
    victim->Wait(absl::Seconds(5));
    if (!killed.HasBeenNotified()) killed.Notify();
    survivors.join();
  });
  ASSERT_EQ(victim->ReadLine(absl::Seconds(20)), "rank 2");
  if (action != "idle") {
    // Rank 0 and the victim are both inside the collective when the victim dies.
    ASSERT_TRUE(
        WaitFor([&] { return coordinator->engine().WaitingRanks(group) == 2; }, absl::Seconds(20)));
  }
  kill_time = absl::Now();
  victim->Kill(SIGKILL);
  ASSERT_NE(victim->Wait(absl::Seconds(5)), -1);
  // Rank 1 joins the collective only once the coordinator has acted on the death (rank 0 got
  // its answer): had it arrived first, all three ranks would have entered and the collective
  // would rightly have completed.
  if (action != "idle") {
    ASSERT_TRUE(first_answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  killed.Notify();
  std::move(cleanup).Invoke();
  for (int r = 0; r < 2; ++r) {
    for (const absl::Status& s : {first[r], second[r]}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << "rank " << r << ": " << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 (host zz-victim)"));
    }
    EXPECT_THAT(std::string(second[r].message()), HasSubstr("no heartbeat"));
    if (action != "idle") {
      // Inside the collective, the death is known at once from the dropped call.
      EXPECT_THAT(std::string(first[r].message()), HasSubstr("abandoned"));
    }
    // Heartbeat timeout is 2 s; allow scheduling slack on a loaded 2-core machine.
    EXPECT_LT(when[r] - kill_time, absl::Seconds(8)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Actions, MemberDiesTest,
                         ::testing::Values("barrier", "all_reduce", "idle"),
                         [](const auto& info) { return info.param; });

TEST(Liveness, HungMemberWithoutHeartbeats_DeclaredDeadByName) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<absl::Status> results(3);
  absl::Mutex mu;
  int answered = 0;
  RunRanks(
      coordinator->address(), "hung", 3,
      [&](ProcessGroup& pg) {
        if (pg.rank() == 1) {
          // Alive but silent: makes no call and sends no heartbeat until the others are done.
          absl::MutexLock lock(&mu);
          mu.AwaitWithTimeout(absl::Condition(
                                  +[](int* n) { return *n == 2; }, &answered),
                              absl::Seconds(20));
          return absl::OkStatus();
        }
        absl::Status s = pg.AllReduce(Floats(8), v1::REDUCE_OP_SUM).status();
        absl::MutexLock lock(&mu);
        results[pg.rank()] = s;
        ++answered;
        return absl::OkStatus();
      },
      [](ProcessGroupOptions& o, int i) { o.send_heartbeats = i != 1; });
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 1 (host host-1)"));
  }
}

TEST(Leave, MemberLeavesCleanly_OthersToldByNameAndGroupNotFailed) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  absl::Status waiting;
  auto statuses = RunRanks(coordinator->address(), "leave", 2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      // Leaves only once rank 0 waits in the barrier: the leave must end a wait under way.
      if (!WaitFor([&] { return coordinator->engine().WaitingRanks("leave") == 1; },
                   absl::Seconds(10))) {
        return absl::DeadlineExceededError("rank 0 never waited in the barrier");
      }
      return pg.Leave();
    }
    waiting = pg.Barrier("waiting-for-leaver");
    return absl::OkStatus();
  });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(waiting.code(), absl::StatusCode::kFailedPrecondition) << waiting;
  EXPECT_THAT(std::string(waiting.message()), HasSubstr("rank 1 (host host-1) left"));
}

TEST(Shutdown, PendingCallsGetUnavailable) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  absl::Notification stopped;
  bool waited = false;
  std::thread stopper([&] {
    // Shuts down only once rank 0 waits in the barrier: the shutdown must end a wait under way.
    waited = WaitFor([&] { return coordinator->engine().WaitingRanks("shutdown") == 1; },
                     absl::Seconds(10));
    coordinator->Shutdown();
    stopped.Notify();
  });
  auto statuses = RunRanks(coordinator->address(), "shutdown", 2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      stopped.WaitForNotificationWithTimeout(absl::Seconds(20));
      return absl::OkStatus();
    }
    return pg.Barrier("never-completes");
  });
  stopper.join();
  EXPECT_TRUE(waited) << "rank 0 never waited in the barrier";
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kUnavailable) << statuses[0];
}

}  // namespace failure_test
}  // namespace dtrain::testing

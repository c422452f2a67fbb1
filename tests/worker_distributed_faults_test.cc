// The collective planes on misuse and faults: a plane refused by name, shared memory's
// mismatched calls (a split update's landing too) and missing rank named on every rank, a
// cancelled step ending the wait for a peer that never comes (on every plane; the coordinator's
// barriers too), Gloo's sliced waits never reporting a false timeout, and the bounds on Gloo's
// connect (its store's waits, its budget), a coordinator's clean shutdown heard at once on every
// plane, and a frozen coordinator waited out for less than the heartbeat timeout and named past
// it.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/kv_client.h"
#include "common/channel.h"
#include "tests/local_cluster.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/collectives/collective_backend.h"
#include "worker/collectives/collective_plane.h"
#include "worker/collectives/coordinator_store.h"
#include "worker/collectives/gloo_collective_backend.h"

namespace dtrain {
namespace worker_distributed_faults_test {

using ::testing::HasSubstr;

// The peer-to-peer planes refuse an all_gather whose ranks differ in more than the first
// dimension before any data moves, on every rank: a scalar against a vector (both one element a
// row), and rows of as many elements in as many dimensions but another shape. Each plane, made
// again over the same group, then gathers.
TEST(AllGatherShapes, ScalarAgainstVectorAndTransposedRows_RefusedOnEveryRankOfEachPlane) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  for (const std::string plane : {"gloo", "shm"}) {
    std::vector<absl::StatusOr<std::vector<torch::Tensor>>> scalar(2, absl::UnknownError("")),
        rows(2, absl::UnknownError("")), again(2, absl::UnknownError(""));
    auto statuses = testing::RunRanks(
        address, "gather-shapes-" + plane, 2, [&](ProcessGroup& pg) -> absl::Status {
          auto backend = MakeBackend(plane, address, &pg, absl::Seconds(30));
          if (!backend.ok()) return backend.status();
          scalar[pg.rank()] =
              (*backend)->AllGather(pg.rank() == 0 ? torch::tensor(1.0f) : torch::ones({3}));
          // Gloo refused before moving anything and stays usable; shm's segment is poisoned.
          if (plane == "shm") {
            backend.value().reset();
            backend = MakeBackend(plane, address, &pg, absl::Seconds(30));
            if (!backend.ok()) return backend.status();
          }
          rows[pg.rank()] = (*backend)->AllGather(pg.rank() == 0 ? torch::ones({4, 2, 3})
                                                                 : torch::ones({1, 3, 2}));
          // Made again over the same group generation: a second Gloo context must not meet
          // the first one's rendezvous keys.
          backend.value().reset();
          backend = MakeBackend(plane, address, &pg, absl::Seconds(30));
          if (!backend.ok()) return backend.status();
          again[pg.rank()] = (*backend)->AllGather(torch::full({1 + pg.rank()}, 1.0f + pg.rank()));
          return absl::OkStatus();
        });
    for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << plane << ": " << s;
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(absl::StrCat(plane, ", rank ", r));
      EXPECT_EQ(scalar[r].status().code(), absl::StatusCode::kFailedPrecondition)
          << scalar[r].status();
      EXPECT_EQ(rows[r].status().code(), absl::StatusCode::kFailedPrecondition) << rows[r].status();
      const std::string s(scalar[r].status().message()), t(rows[r].status().message());
      if (plane == "gloo") {
        EXPECT_THAT(s, HasSubstr(r == 0 ? "rank 0 gathers a Float scalar, rank 1 a 1-dimensional"
                                        : "rank 1 gathers a 1-dimensional Float tensor, rank 0 "
                                          "a Float scalar"));
        EXPECT_THAT(t, HasSubstr(absl::StrCat(
                           "rank ", r, " gathers a 3-dimensional Float tensor with rows shaped ",
                           r == 0 ? "[2, 3]" : "[3, 2]", ", rank ", 1 - r,
                           " a 3-dimensional Float tensor with rows of another shape")));
      } else {
        EXPECT_THAT(s, HasSubstr("all_gather of Float scalars"));
        EXPECT_THAT(s, HasSubstr("all_gather of Float rows of 1 elements in 1 dimensions"));
        EXPECT_THAT(t, HasSubstr(absl::StrCat("shaped ", r == 0 ? "[2, 3]" : "[3, 2]", ", rank ",
                                              1 - r, " in one whose rows have another shape")));
      }
      // The plane made again gathers: rank 0's one row of 1, rank 1's two rows of 2.
      ASSERT_TRUE(again[r].ok()) << again[r].status();
      ASSERT_EQ(again[r]->size(), 2u);
      EXPECT_TRUE(torch::equal((*again[r])[0], torch::full({1}, 1.0f)));
      EXPECT_TRUE(torch::equal((*again[r])[1], torch::full({2}, 2.0f)));
    }
  }
}

// A worker handed a Setup that did not pass the coordinator refuses nccl as the spec does, and
// lists the planes for a name it does not know; neither touches the group.
TEST(CollectivePlane, NcclRefusedByName_UnknownNamesListThePlanes) {
  auto nccl = ConnectCollectivePlane("nccl", "", nullptr, absl::Seconds(1), absl::Seconds(1));
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(nccl.status().message()),
              HasSubstr("'nccl' is not built: dtrain has no NCCL plane"));
  auto mpi = ConnectCollectivePlane("mpi", "", nullptr, absl::Seconds(1), absl::Seconds(1));
  EXPECT_EQ(mpi.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mpi.status().message()), HasSubstr("use auto, grpc, gloo or shm"));
}

// Shared memory is loud on misuse: ranks whose calls differ all get FAILED_PRECONDITION
// naming both calls, later calls fail at once, and a rank that never comes is named at the
// deadline.
TEST(SharedMemoryBackend, MismatchedCallsAndAMissingRank_NamedOnEveryRank) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  std::vector<absl::Status> mismatch(2), after(2);
  auto statuses =
      testing::RunRanks(address, "shm-mismatch", 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend("shm", address, &pg, absl::Seconds(30));
        if (!backend.ok()) return backend.status();
        torch::Tensor t = torch::ones({pg.rank() == 0 ? 100 : 200});
        mismatch[pg.rank()] = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        after[pg.rank()] = (*backend)->Barrier("after");
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mismatch[r].code(), absl::StatusCode::kFailedPrecondition) << mismatch[r];
    EXPECT_THAT(std::string(mismatch[r].message()),
                HasSubstr("all_reduce of 100 Float REDUCE_OP_SUM"));
    EXPECT_THAT(std::string(mismatch[r].message()),
                HasSubstr("all_reduce of 200 Float REDUCE_OP_SUM"));
    EXPECT_EQ(after[r].code(), absl::StatusCode::kFailedPrecondition) << after[r];
  }

  // all_gather may differ in its first dimension only: a row of another size or number of
  // dimensions is named too (AllGatherShapes above: a row of another shape).
  std::vector<absl::StatusOr<std::vector<torch::Tensor>>> gathered(2, absl::UnknownError(""));
  statuses = testing::RunRanks(address, "shm-gather", 2, [&](ProcessGroup& pg) -> absl::Status {
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(30));
    if (!backend.ok()) return backend.status();
    gathered[pg.rank()] =
        (*backend)->AllGather(pg.rank() == 0 ? torch::ones({3, 2}) : torch::ones({5, 2, 1}));
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(gathered[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << gathered[r].status();
    EXPECT_THAT(std::string(gathered[r].status().message()),
                HasSubstr("all_gather of Float rows of 2 elements in 2 dimensions"));
    EXPECT_THAT(std::string(gathered[r].status().message()),
                HasSubstr("all_gather of Float rows of 2 elements in 3 dimensions"));
  }

  // One rank reduces its shared buffer, the other ordinary memory of the same size: not the
  // same collective, and said so.
  statuses = testing::RunRanks(address, "shm-where", 2, [&](ProcessGroup& pg) -> absl::Status {
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(30));
    if (!backend.ok()) return backend.status();
    absl::StatusOr<torch::Tensor> shared = (*backend)->AllocateForAllReduce(64, torch::kFloat32);
    if (!shared.ok()) return shared.status();
    torch::Tensor plain = torch::ones({64});
    mismatch[pg.rank()] =
        (*backend)->AllReduce(pg.rank() == 0 ? *shared : plain, v1::REDUCE_OP_SUM);
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mismatch[r].code(), absl::StatusCode::kFailedPrecondition) << mismatch[r];
    EXPECT_THAT(std::string(mismatch[r].message()),
                HasSubstr("all_reduce of 64 Float REDUCE_OP_SUM in shared buffer #0 at element 0"));
  }

  // A split update whose result one rank wants everywhere and the other in its own part only
  // would leave part of it unaveraged: named as a mismatch, not done.
  statuses = testing::RunRanks(address, "shm-landing", 2, [&](ProcessGroup& pg) -> absl::Status {
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(30));
    if (!backend.ok()) return backend.status();
    absl::StatusOr<torch::Tensor> grads = (*backend)->AllocateForAllReduce(64, torch::kFloat32);
    if (!grads.ok()) return grads.status();
    absl::StatusOr<torch::Tensor> mirror = (*backend)->AllocateForAllReduce(64, torch::kFloat32);
    if (!mirror.ok()) return mirror.status();
    bool updated = false;
    mismatch[pg.rank()] = (*backend)->AllReduceThenUpdate(
        *grads, v1::REDUCE_OP_MEAN, *mirror,
        [&](int64_t, int64_t) {
          updated = true;
          return absl::OkStatus();
        },
        {}, /*result_everywhere=*/pg.rank() == 0);
    if (updated) return absl::InternalError("updated after a mismatched call");
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mismatch[r].code(), absl::StatusCode::kFailedPrecondition) << mismatch[r];
    // Both calls described, only rank 1's with its result in its own part.
    const std::string message(mismatch[r].message());
    const std::string own =
        "then a split update, in shared buffer #0 at element 0, its result "
        "in each rank's own part only";
    const std::string call = absl::StrCat("an all_reduce of 64 Float REDUCE_OP_MEAN ", own);
    EXPECT_TRUE(absl::StrContains(message, "rank 1 is in " + call) ||
                absl::StrContains(message, "rank 1 in " + call))
        << message;
    const size_t first = message.find("then a split update");
    ASSERT_NE(first, std::string::npos) << message;
    EXPECT_NE(message.find("then a split update", first + 1), std::string::npos) << message;
    EXPECT_EQ(message.find("own part only"), message.rfind("own part only")) << message;
  }

  absl::Status waited;
  absl::Duration took;
  absl::Notification answered;
  statuses = testing::RunRanks(address, "shm-missing", 2, [&](ProcessGroup& pg) -> absl::Status {
    // 4 s: the timeout also bounds the planes' set-up, which a loaded machine slows.
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(4));
    if (!backend.ok()) return backend.status();
    if (pg.rank() == 1) {
      // Alive (heartbeating) but never calls, until rank 0 has its answer.
      answered.WaitForNotificationWithTimeout(absl::Seconds(30));
      return absl::OkStatus();
    }
    torch::Tensor t = torch::ones({1000});
    const absl::Time start = absl::Now();
    waited = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
    took = absl::Now() - start;
    answered.Notify();
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("rank(s) 1 did not arrive within 4s"));
  EXPECT_GE(took, absl::Seconds(4));
  EXPECT_LT(took, absl::Seconds(10));
}

// Ranks of a cancelled step stop at their own next batch, so one may wait in a collective its
// peer (alive, heartbeating) never starts: neither the group's health nor a timeout of minutes
// would end that wait, the cancellation must. On every plane (the coordinator's, whose call is
// cancelled), and for a collective shm hands to the plane it wraps (bool); the plane is broken
// afterwards, loudly.
class InterruptedWait : public ::testing::TestWithParam<std::string> {};

TEST_P(InterruptedWait, ACancelledStepEndsTheWaitForAPeerThatNeverComes) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  const bool through_inner = GetParam() == "shm-bool";
  absl::Status waited, later;
  absl::Duration took, later_took;
  absl::Notification done;
  auto statuses = testing::RunRanks(
      address, "interrupt-" + GetParam(), 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend =
            MakeBackend(through_inner ? "shm" : GetParam(), address, &pg, absl::Minutes(5));
        if (!backend.ok()) return backend.status();
        if (pg.rank() == 1) {
          // Alive, but never calls until rank 0 is done: only the interruption can end its wait
          // (leaving would end it too, after 30 s, and fail the time check below).
          done.WaitForNotificationWithTimeout(absl::Seconds(30));
          return absl::OkStatus();
        }
        auto make = [&] {
          return through_inner ? torch::ones({1000}, torch::kBool) : torch::ones({1000});
        };
        torch::Tensor t = make();
        const absl::Time start = absl::Now();
        // The interruption comes 300 ms after the call began, while it waits for rank 1: the
        // delay is the scenario (a wait under way is ended), not settling. A call that ended
        // before it, or was not ended by it, fails the time checks below.
        std::thread canceller([&] {
          absl::SleepFor(absl::Milliseconds(300));
          (*backend)->Interrupt(absl::CancelledError("job j was cancelled"));
        });
        waited = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        took = absl::Now() - start;
        canceller.join();
        (*backend)->ClearInterrupt();  // the next step begins
        torch::Tensor u = make();
        const absl::Time again = absl::Now();
        later = (*backend)->AllReduce(u, v1::REDUCE_OP_SUM);
        later_took = absl::Now() - again;
        done.Notify();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("all_reduce on rank 0"));
  EXPECT_THAT(std::string(waited.message()), HasSubstr("job j was cancelled"));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(10));  // not the 30 s leave nor the 5 min timeout
  // The interrupted collective left the plane half-done: later calls fail at once.
  EXPECT_FALSE(later.ok());
  EXPECT_LT(later_took, absl::Seconds(5));
}

// The coordinator's barriers and decisions travel on a session stream that lives between calls:
// an interruption while no call runs (a Teardown after the last step) leaves the plane whole,
// and one during a barrier ends that wait, naming it.
TEST(GrpcBackend, InterruptWhileIdle_LeavesThePlaneWhole_DuringABarrier_EndsTheWait) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  absl::Status idle_then, waited;
  absl::Duration took;
  absl::Notification done;
  auto statuses =
      testing::RunRanks(address, "interrupt-idle", 2, [&](ProcessGroup& pg) -> absl::Status {
        GrpcCollectiveBackend backend(&pg);
        if (absl::Status s = backend.Barrier("before"); !s.ok()) return s;
        backend.Interrupt(absl::CancelledError("job j was cancelled"));
        backend.ClearInterrupt();
        // Both ranks: the session the interruption found idle still serves.
        absl::Status after = backend.Barrier("after");
        if (pg.rank() == 0) idle_then = after;
        if (pg.rank() == 1) {
          done.WaitForNotificationWithTimeout(absl::Seconds(30));
          return absl::OkStatus();
        }
        const absl::Time start = absl::Now();
        std::thread canceller([&] {
          absl::SleepFor(absl::Milliseconds(300));
          backend.Interrupt(absl::CancelledError("job j was cancelled"));
        });
        waited = backend.Barrier("never-joined");
        took = absl::Now() - start;
        canceller.join();
        done.Notify();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(idle_then.ok()) << idle_then;
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("barrier on rank 0: job j was cancelled"));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(10));
}

// Gloo's waits are sliced (to poll the interruption and the group's health): an operation that
// completes as a slice runs out is a success, never a false "timed out". Rank 1 arrives at
// about the slice length late, many times over.
TEST(GlooBackend, OperationsCompletingAtASliceBoundary_Succeed) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  auto statuses =
      testing::RunRanks(address, "gloo-slices", 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend("gloo", address, &pg, absl::Seconds(30));
        if (!backend.ok()) return backend.status();
        for (int i = 0; i < 150; ++i) {
          if (pg.rank() == 1) absl::SleepFor(absl::Microseconds(19000 + (i * 37) % 2000));
          torch::Tensor t = torch::full({16}, static_cast<float>(pg.rank() + 1));
          if (absl::Status s = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM); !s.ok()) {
            return absl::Status(s.code(), absl::StrCat("operation ", i, ": ", s.message()));
          }
          if (!torch::equal(t, torch::full({16}, 3.0f))) {
            return absl::InternalError(absl::StrCat("operation ", i, ": wrong sum"));
          }
        }
        return absl::OkStatus();
      });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

// Gloo asks its store for its context's timeout, a fifth of the connect budget: the store waits
// at least the whole budget for a key, and "no timeout" (zero) still waits until the key comes.
TEST(CoordinatorStore, AShortWaitLastsTheMinimum_NoTimeoutStillWaitsForTheKey) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  auto kv =
      std::make_shared<KeyValueClient>(ConnectToCoordinator(coordinator->address()), "store-waits");
  CoordinatorStore store(kv, std::chrono::milliseconds(5000), std::chrono::milliseconds(600));
  const absl::Time start = absl::Now();
  std::string error;
  try {
    store.wait({"never"}, std::chrono::milliseconds(100));
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  const absl::Duration waited = absl::Now() - start;
  EXPECT_THAT(error, HasSubstr("timed out after 600 ms waiting for key 'never'"));
  EXPECT_GE(waited, absl::Milliseconds(590));
  EXPECT_LT(waited, absl::Seconds(4)) << "the store's default (5 s) is not the minimum";
  // Set after the minimum has passed: a wait without timeout must still be there to see it.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(900));
    EXPECT_TRUE(kv->Set("late", "v").ok());
  });
  const absl::Time before = absl::Now();
  EXPECT_NO_THROW(store.wait({"late"}, c10d::Store::kNoTimeout));
  EXPECT_GE(absl::Now() - before, absl::Milliseconds(850));
  setter.join();
  EXPECT_EQ(store.get("late"), (std::vector<uint8_t>{'v'}));
}

// A zero budget would be "no timeout" to the store but an immediate give-up to Gloo's pairs:
// refused before anything connects.
TEST(GlooBackend, NonPositiveTimeouts_Refused) {
  GlooConnectOptions none;
  none.timeout = absl::ZeroDuration();
  auto made = GlooCollectiveBackend::Make("127.0.0.1:1", static_cast<ProcessGroup*>(nullptr),
                                          absl::Seconds(1), none);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(made.status().message(), HasSubstr("0 for connecting"));
  made = GlooCollectiveBackend::Make("127.0.0.1:1", static_cast<ProcessGroup*>(nullptr),
                                     absl::Seconds(-1));
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(made.status().message(), HasSubstr("-1s for operations"));
}

// A coordinator that shuts down cleanly (SIGTERM) ends a group whose rank waits in a collective
// for a peer that is alive but has not called: on the Gloo and shared-memory planes, whose data
// does not pass through the coordinator, the waiting rank hears it from its next heartbeat's
// answer, not after the heartbeat timeout (20 s here) of a silent coordinator. The coordinator
// answers one more heartbeat round before it stops serving, and not longer.
class CoordinatorShutdown : public ::testing::TestWithParam<std::string> {};

TEST_P(CoordinatorShutdown, ARankWaitingForItsPeerHearsItAtOnce_OnEveryPlane) {
  CoordinatorOptions options = testing::FastOptions();
  options.groups.heartbeat_timeout = absl::Seconds(20);
  auto coordinator = testing::StartCoordinator(options);
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  absl::Status waited, peer_health;
  absl::Duration took, shutdown_took;
  absl::Notification done;
  auto statuses = testing::RunRanks(
      address, "shutdown-" + GetParam(), 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend(GetParam(), address, &pg, absl::Minutes(5));
        if (!backend.ok()) return backend.status();
        if (pg.rank() == 1) {
          // Alive (heartbeating) but never calls: only the shutdown can end rank 0's wait.
          done.WaitForNotificationWithTimeout(absl::Seconds(60));
          // Told by the answer to a heartbeat, which may still be on its way back.
          const absl::Time until = absl::Now() + absl::Seconds(10);
          while ((peer_health = pg.health()).ok() && absl::Now() < until) {
            absl::SleepFor(absl::Milliseconds(10));
          }
          return absl::OkStatus();
        }
        torch::Tensor t = torch::ones({1000});
        const absl::Time start = absl::Now();
        // The shutdown comes 300 ms after the call began, while it waits for rank 1: the delay
        // is the scenario (a wait under way), not settling; the time checks below catch a call
        // that ended before it.
        std::thread stopper([&] {
          absl::SleepFor(absl::Milliseconds(300));
          const absl::Time begin = absl::Now();
          coordinator->Shutdown();
          shutdown_took = absl::Now() - begin;
        });
        waited = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        took = absl::Now() - start;
        stopper.join();
        done.Notify();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(waited.ok());
  EXPECT_THAT(std::string(waited.message()), HasSubstr("all_reduce"));
  EXPECT_THAT(std::string(waited.message()), HasSubstr("the coordinator is shutting down"));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(8)) << waited;  // not the 20 s heartbeat timeout
  // The peer heard it too, by its own heartbeat, as a final answer.
  EXPECT_EQ(peer_health.code(), absl::StatusCode::kFailedPrecondition) << peer_health;
  EXPECT_THAT(std::string(peer_health.message()), HasSubstr("the coordinator is shutting down"));
  // Every member was told by its next 100 ms heartbeat (the window is 1.2 s); the server's own
  // stop allows calls in flight 2 s.
  EXPECT_LT(shutdown_took, absl::Seconds(5));
  std::printf("%s: the wait ended after %s (%s); the shutdown took %s\n", GetParam().c_str(),
              absl::FormatDuration(took).c_str(), waited.ToString().c_str(),
              absl::FormatDuration(shutdown_took).c_str());
}

// The coordinator silent (SIGSTOP: its connections stay up, nothing answers) while a rank waits
// in a Gloo or shared-memory collective, whose data does not pass through it: for less than the
// heartbeat timeout, the collective completes with the right sum (a late heartbeat is not a
// verdict); past it, the waiting rank's call fails naming the coordinator, within the timeout
// and the plane's health poll, not after the collective's timeout of a minute.
class CoordinatorFrozen : public ::testing::TestWithParam<std::string> {};

TEST_P(CoordinatorFrozen, BelowTheTimeoutACollectiveCompletes_PastItTheWaitEndsNamingIt) {
  testing::LocalCluster cluster(
      absl::StrCat(::testing::TempDir(), "/coordinator-frozen-", GetParam(), "-", getpid()));
  ASSERT_TRUE(cluster.StartCoordinator("127.0.0.1:0",
                                       {"--heartbeat_interval=100ms", "--heartbeat_timeout=2s"}));
  const pid_t coordinator = cluster.coordinator_pid();
  std::atomic<bool> frozen{false};
  auto freeze = [&] { frozen = kill(coordinator, SIGSTOP) == 0; };
  auto thaw = [&] {
    if (frozen.exchange(false)) kill(coordinator, SIGCONT);
  };
  absl::Notification in_first, in_second, second_done;
  absl::Status first[2], second;
  float sum[2] = {0, 0};
  absl::Duration second_took;
  auto statuses = testing::RunRanks(
      cluster.address(), "frozen-" + GetParam(), 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend(GetParam(), cluster.address(), &pg, absl::Minutes(1));
        if (!backend.ok()) return backend.status();
        const int r = pg.rank();
        if (auto s = (*backend)->Barrier("start"); !s.ok()) return s;
        // A silence of 1 s, half the timeout, while rank 0 waits for rank 1.
        torch::Tensor t = torch::full({1000}, static_cast<float>(r + 1));
        if (r == 0) {
          in_first.Notify();
          first[0] = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        } else {
          in_first.WaitForNotification();
          absl::SleepFor(absl::Milliseconds(200));  // rank 0 is in its call
          freeze();
          absl::SleepFor(absl::Seconds(1));
          thaw();
          first[1] = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        }
        sum[r] = t[999].item<float>();
        if (!first[r].ok()) return absl::OkStatus();
        // Past the timeout, while rank 0 waits for rank 1, which calls only after rank 0's
        // answer (and the thaw).
        if (r == 0) {
          in_second.Notify();
          torch::Tensor u = torch::ones({1000});
          const absl::Time start = absl::Now();
          second = (*backend)->AllReduce(u, v1::REDUCE_OP_SUM);
          second_took = absl::Now() - start;
          thaw();
          second_done.Notify();
        } else {
          in_second.WaitForNotification();
          absl::SleepFor(absl::Milliseconds(200));
          freeze();
          second_done.WaitForNotificationWithTimeout(absl::Seconds(30));
          thaw();
        }
        return absl::OkStatus();
      });
  thaw();
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(first[r].ok()) << "rank " << r << ": " << first[r];
    EXPECT_EQ(sum[r], 3.0f) << "rank " << r;
  }
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable) << second;
  EXPECT_THAT(std::string(second.message()),
              HasSubstr(absl::StrCat("the coordinator at ", cluster.address(),
                                     " has answered no heartbeat for")));
  EXPECT_THAT(std::string(second.message()), HasSubstr("all_reduce"));
  // The last answer came at most an interval before the freeze, 200 ms into the call.
  EXPECT_GE(second_took, absl::Milliseconds(1500));
  EXPECT_LT(second_took, absl::Seconds(10));  // not the collective's minute
  std::printf("%s: past the timeout the wait ended after %s: %s\n", GetParam().c_str(),
              absl::FormatDuration(second_took).c_str(), second.ToString().c_str());
}

INSTANTIATE_TEST_SUITE_P(Planes, InterruptedWait,
                         ::testing::Values("grpc", "gloo", "shm", "shm-bool"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

INSTANTIATE_TEST_SUITE_P(Planes, CoordinatorShutdown, ::testing::Values("grpc", "gloo", "shm"));
INSTANTIATE_TEST_SUITE_P(Planes, CoordinatorFrozen, ::testing::Values("gloo", "shm"));

}  // namespace worker_distributed_faults_test
}  // namespace dtrain

// The job manager's decision after a run ends (coordinator/jobs/run_policy.h), case by case:
// success, cancel, the job's own error, lost workers with and without elasticity, restarts used
// up, drains with and without enough workers left.
#include <gtest/gtest.h>

#include "coordinator/jobs/run_policy.h"

namespace dtrain {
namespace run_policy_test {

RunEnding Elastic(absl::Status status) {
  RunEnding e;
  e.status = std::move(status);
  e.num_nodes = 3;
  e.min_nodes = 1;
  e.max_restarts = 2;
  return e;
}

TEST(RunPolicyTest, Success_Ends) {
  RunEnding e = Elastic(absl::OkStatus());
  EXPECT_FALSE(MayRunAgain(e));
  EXPECT_EQ(DecideNextRun(e, 1, 3).next, NextRun::kEnd);
  EXPECT_EQ(OutcomeOf(e.status, false).state, v1::SUCCEEDED);
  EXPECT_EQ(OutcomeOf(e.status, false).reason, "");
}

TEST(RunPolicyTest, Cancelled_EndsCancelledEvenWhenDrainedOrLost) {
  RunEnding e = Elastic(absl::CancelledError("x"));
  e.cancel_requested = true;
  e.drained = true;
  EXPECT_FALSE(MayRunAgain(e));
  EXPECT_EQ(DecideNextRun(e, 1, 3).next, NextRun::kEnd);
  // A cancelled job whose worker died meanwhile is still CANCELLED, not FAILED.
  const Outcome outcome = OutcomeOf(absl::UnavailableError("worker gone"), true);
  EXPECT_EQ(outcome.state, v1::CANCELLED);
  EXPECT_EQ(outcome.reason, "cancelled by request");
}

TEST(RunPolicyTest, JobsOwnError_EndsFailedWithItsMessage) {
  for (absl::Status s : {absl::InvalidArgumentError("bad model"), absl::InternalError("nan"),
                         absl::FailedPreconditionError("x")}) {
    RunEnding e = Elastic(s);
    EXPECT_FALSE(MayRunAgain(e)) << s;
    EXPECT_EQ(DecideNextRun(e, 1, 3).next, NextRun::kEnd) << s;
    EXPECT_EQ(OutcomeOf(s, false).state, v1::FAILED);
    EXPECT_EQ(OutcomeOf(s, false).reason, s.message());
  }
}

TEST(RunPolicyTest, LostWorker_Elastic_Reforms_UsingARestart) {
  for (absl::Status s : {absl::UnavailableError("lost w1"), absl::AbortedError("group failed"),
                         absl::DeadlineExceededError("late")}) {
    RunEnding e = Elastic(s);
    EXPECT_TRUE(MayRunAgain(e)) << s;
    const RunDecision d = DecideNextRun(e, 1, 2);
    EXPECT_EQ(d.next, NextRun::kReform) << s;
    EXPECT_TRUE(d.uses_restart);
  }
}

TEST(RunPolicyTest, LostWorkerCodeButNoWorkerLost_IsTheJobsOwnFailure) {
  RunEnding e = Elastic(absl::DeadlineExceededError("a step took too long"));
  EXPECT_TRUE(MayRunAgain(e));
  EXPECT_EQ(DecideNextRun(e, /*lost_workers=*/0, 3).next, NextRun::kEnd);
}

TEST(RunPolicyTest, LostWorker_TooFewLeft_Fails) {
  RunEnding e = Elastic(absl::UnavailableError("lost"));
  e.min_nodes = 2;
  EXPECT_EQ(DecideNextRun(e, 2, 1).next, NextRun::kFail);
  EXPECT_EQ(DecideNextRun(e, 1, 2).next, NextRun::kReform);
}

TEST(RunPolicyTest, LostWorker_NotElasticOrRestartsUsedUp_Ends) {
  RunEnding fixed = Elastic(absl::UnavailableError("lost"));
  fixed.min_nodes = fixed.num_nodes;
  EXPECT_FALSE(MayRunAgain(fixed));
  EXPECT_EQ(DecideNextRun(fixed, 1, 3).next, NextRun::kEnd);

  RunEnding used = Elastic(absl::UnavailableError("lost"));
  used.restarts = used.max_restarts;
  EXPECT_FALSE(MayRunAgain(used));
  EXPECT_EQ(DecideNextRun(used, 1, 3).next, NextRun::kEnd);
}

TEST(RunPolicyTest, Drained_ReformsWithoutARestart_EvenWhenNotElastic) {
  RunEnding e = Elastic(absl::UnavailableError("let 'w1' go"));
  e.drained = true;
  e.min_nodes = e.num_nodes;    // not elastic
  e.restarts = e.max_restarts;  // and no restart left
  EXPECT_TRUE(MayRunAgain(e));
  const RunDecision d = DecideNextRun(e, 1, 3);
  EXPECT_EQ(d.next, NextRun::kReform);
  EXPECT_FALSE(d.uses_restart);
}

TEST(RunPolicyTest, Drained_TooFewLeft_RequeuesRatherThanFails) {
  RunEnding e = Elastic(absl::UnavailableError("let 'w1' go"));
  e.drained = true;
  e.min_nodes = 3;
  EXPECT_EQ(DecideNextRun(e, 1, 2).next, NextRun::kRequeue);
}

}  // namespace run_policy_test
}  // namespace dtrain

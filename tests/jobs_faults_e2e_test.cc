// Jobs that fail, end to end against a real local cluster: a model that fails on its workers,
// and a worker SIGKILLed or SIGSTOPped mid-epoch or during validation. Each job fails naming the
// worker (a lost one within the heartbeat timeout), the workers left serve the next job, and a
// stopped worker that is continued serves again.
#include <signal.h>
#include <string.h>

#include <cstdio>
#include <string>

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dtrain/v1/jobs.pb.h"
#include "tests/jobs_e2e_fixture.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace jobs_faults_e2e_test {

using ::testing::HasSubstr;

TEST_F(JobsE2eTest, ModelFailsOnWorker_JobFailedWithTheWorkersMessage_WorkersFreed) {
  // A path that is not a file here is refused at submit, unless marked as the workers' own.
  CommandResult local = Dtrain("fit --config " + WriteJob("unsent", R"(name: unsent
model: {torchscript: /nonexistent/model.pt}
data: {synthetic: {train_size: 64}}
)"));
  EXPECT_EQ(local.exit_code, 2) << local.output;
  EXPECT_THAT(local.output, HasSubstr("model.torchscript: '/nonexistent/model.pt' is not a file "
                                      "here, so it cannot be sent with the job; if it is already "
                                      "on every worker, write worker:/nonexistent/model.pt"));
  const std::string job = WriteJob("broken", R"(name: broken
model: {torchscript: "worker:/nonexistent/model.pt"}
data: {synthetic: {train_size: 64}}
trainer: {num_nodes: 2}
)");
  CommandResult failed = Dtrain("fit --wait --config " + job);
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_THAT(failed.output, HasSubstr("job broken-1 FAILED: setup failed on worker 'w"));
  EXPECT_THAT(failed.output, HasSubstr("model: model file '/nonexistent/model.pt' does not exist"));
  // The workers are free for the next job.
  CommandResult next = Dtrain("fit --wait --config " + WriteJob("after", SyntheticJob("after", 1)));
  EXPECT_EQ(next.exit_code, 0) << next.output;
}

// Fault injection: a worker SIGKILLed mid-epoch (dead), or SIGSTOPped (alive to the kernel,
// silent to everyone: a straggler). Either way the job fails within the heartbeat timeout (5 s
// here) naming the worker, the surviving worker is freed for the next job, and a stopped worker
// that comes back (SIGCONT) registers again and serves.
class JobsFaultTest : public JobsE2eTest, public ::testing::WithParamInterface<int> {};

TEST_P(JobsFaultTest, WorkerLostMidEpoch_JobFailsNamingIt_SurvivorServesTheNextJob) {
  const int signal = GetParam();
  // Sized calls pass step 20 in the first call; the loss lands in a training call, or in the
  // validation or checkpoint at step 64: any call must fail at the heartbeat timeout.
  const std::string victim = SyntheticJob("victim", 1000, 8192);
  CommandResult first = Dtrain("fit --output json --config " + WriteJob("victim", victim));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id = ParseJson(first.output).fields().at("id").string_value();
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).progress().global_step() > 20; }, absl::Seconds(30)));
  const int64_t step_before = GetJob(id).progress().global_step();

  const absl::Time start = absl::Now();
  cluster_->worker("w1").process().Kill(signal);
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).state() == v1::FAILED; }, absl::Seconds(30)));
  const absl::Duration took = absl::Now() - start;
  const v1::JobStatus failed = GetJob(id);
  std::printf("%s: FAILED after %s at step %lld (was %lld): %s\n", strsignal(signal),
              absl::FormatDuration(took).c_str(),
              static_cast<long long>(failed.progress().global_step()),
              static_cast<long long>(step_before), failed.reason().c_str());
  // heartbeat timeout + detection and teardown slack (a loaded CI machine's)
  EXPECT_LT(took, absl::Seconds(5 + 7));
  EXPECT_THAT(failed.reason(), HasSubstr("w1"));
  // No silent progress after the loss: the job did not report steps it could not have made.
  EXPECT_LT(failed.progress().global_step(), step_before + 200);

  // The survivor takes the next job (num_nodes 1) at once.
  std::string one = SyntheticJob("survivor", 1, 512);
  one.replace(one.find("num_nodes: 2"), 12, "num_nodes: 1");
  CommandResult next = Dtrain("fit --wait --config " + WriteJob("survivor", one));
  EXPECT_EQ(next.exit_code, 0) << next.output;

  if (signal == SIGSTOP) {
    // Back from the dead: it re-registers and is listed ALIVE and idle again.
    cluster_->worker("w1").process().Kill(SIGCONT);
    EXPECT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(20)));
  }
}

// A call that runs no collective (validation here) has no group to notice the silent rank: the
// registry's LOST transition must stop it, not gRPC's keepalive (~15 s).
TEST_P(JobsFaultTest, WorkerLostDuringValidation_JobFailsWithinTheHeartbeatTimeout) {
  const int signal = GetParam();
  // One short epoch, then a validation of 12,000 samples one at a time (seconds long).
  std::string job = SyntheticJob("slowval", 1, 256);
  job.replace(job.find("val_size: 256"), 13, "val_size: 12000");
  job.replace(job.find("  batch_size: 32\n"), 17, "  batch_size: 32\n  eval_batch_size: 1\n");
  job.replace(job.find("  val_check_interval: 0.5\n"), 26, "");
  CommandResult first = Dtrain("fit --output json --config " + WriteJob("slowval", job));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id = ParseJson(first.output).fields().at("id").string_value();
  ASSERT_TRUE(
      WaitFor([&] { return GetJob(id).progress().phase() == "validate"; }, absl::Seconds(30)))
      << GetJob(id).DebugString();
  const absl::Time start = absl::Now();
  cluster_->worker("w1").process().Kill(signal);
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).state() == v1::FAILED; }, absl::Seconds(30)))
      << GetJob(id).DebugString();
  const absl::Duration took = absl::Now() - start;
  const v1::JobStatus failed = GetJob(id);
  std::printf("%s during validation: FAILED after %s: %s\n", strsignal(signal),
              absl::FormatDuration(took).c_str(), failed.reason().c_str());
  // heartbeat timeout + detection slack, still short of gRPC's ~15 s keepalive
  EXPECT_LT(took, absl::Seconds(5 + 7));
  EXPECT_THAT(failed.reason(), HasSubstr("validation_step lost worker 'w1'"));

  if (signal == SIGSTOP) {
    EXPECT_THAT(failed.reason(), HasSubstr("no heartbeat for "));
    // The survivor was freed without waiting on the stopped worker's teardown, and the stopped
    // worker, continued, drops the job and serves again.
    cluster_->worker("w1").process().Kill(SIGCONT);
    EXPECT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(20)));
    CommandResult next =
        Dtrain("fit --wait --config " + WriteJob("after", SyntheticJob("after", 1)));
    EXPECT_EQ(next.exit_code, 0) << next.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, JobsFaultTest, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGKILL ? "Sigkill" : "Sigstop");
                         });

}  // namespace jobs_faults_e2e_test
}  // namespace dtrain::testing

// The coordinator SIGKILLed mid-job and restarted on the same state directory and port: its
// jobs are all listed again from its SQLite database (finished ones with their metrics), the
// workers reconnect by themselves, and the job that was running resumes from its last
// checkpoint and ends in exactly the state a run without the crash ends in: the same step, and
// the same weights and optimizer state bit for bit. When that checkpoint is gone, the job ends
// FAILED saying so.
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "tests/checkpoint_comparison.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace coordinator_restart_test {

using ::testing::HasSubstr;

// 4096 samples over 2 ranks in batches of 32: 64 optimizer steps per epoch.
constexpr int kEpochs = 4;
constexpr int64_t kStepsPerEpoch = 64;

class CoordinatorRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/restart-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->AddWorker("w0"));
    ASSERT_TRUE(cluster_->AddWorker("w1"));
    ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 2; }, absl::Seconds(10)));
  }

  void KillAndRestartCoordinator() {
    cluster_->StopCoordinator(SIGKILL);
    ASSERT_TRUE(cluster_->StartCoordinator(cluster_->address()))
        << "the restarted coordinator could not take its port back";
  }

  std::string Submit(const std::string& name, int epochs) {
    return cluster_->Submit(name,
                            SyntheticDdpJob(name, epochs, 4096, "", "checkpoint: {save_top_k: 1}"));
  }

  // Waits until `id` has written a checkpoint and is still running; returns that checkpoint.
  std::string WaitForFirstCheckpoint(const std::string& id) {
    std::string checkpoint;
    EXPECT_TRUE(WaitFor(
        [&] {
          v1::JobStatus s = cluster_->GetJob(id);
          checkpoint = s.checkpoint();
          return !checkpoint.empty() || IsTerminal(s.state());
        },
        absl::Seconds(120)));
    EXPECT_EQ(cluster_->GetJob(id).state(), v1::RUNNING) << "the job ended before the crash";
    return checkpoint;
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(CoordinatorRestartTest, SigkillMidJob_JobsListedAgain_ResumedJobEndsAsAnUninterruptedRun) {
  // The same job run without a crash: finished before the crash, it is also the job listed
  // again afterwards.
  const std::string done = Submit("before", kEpochs);
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->GetJob(done).state() == v1::SUCCEEDED; }, absl::Seconds(120)));
  const v1::JobStatus done_before = cluster_->GetJob(done);
  const std::string id = Submit("long", kEpochs);
  const std::string checkpoint = WaitForFirstCheckpoint(id);
  ASSERT_FALSE(checkpoint.empty());
  const int64_t step_at_crash = cluster_->GetJob(id).progress().global_step();
  KillAndRestartCoordinator();

  // Everything is listed again at once, the finished job with its outcome and metrics.
  CommandResult list = cluster_->Dtrain("list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr(done));
  EXPECT_THAT(list.output, HasSubstr(id));
  // (This process's channel reconnects on its own schedule.)
  ASSERT_TRUE(WaitFor([&] { return !cluster_->GetJob(done).id().empty(); }, absl::Seconds(10)));
  const v1::JobStatus done_after = cluster_->GetJob(done);
  EXPECT_EQ(done_after.state(), v1::SUCCEEDED);
  EXPECT_EQ(done_after.progress().global_step(), kEpochs * kStepsPerEpoch);
  EXPECT_EQ(done_after.metrics().at("test_acc"), done_before.metrics().at("test_acc"));
  CommandResult results = cluster_->Dtrain("results " + done);
  EXPECT_EQ(results.exit_code, 0) << results.output;
  EXPECT_THAT(results.output, HasSubstr("train_loss"));

  // The workers come back by themselves and the job resumes and finishes.
  ASSERT_TRUE(
      WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(180)));
  const v1::JobStatus resumed = cluster_->GetJob(id);
  ASSERT_EQ(resumed.state(), v1::SUCCEEDED) << resumed.reason();
  // Exactly the steps of an uninterrupted run: none lost, none applied twice; and so exactly its
  // weights and optimizer state.
  EXPECT_EQ(resumed.progress().global_step(), kEpochs * kStepsPerEpoch);
  EXPECT_TRUE(SameFinalState(*cluster_, id, done));
  EXPECT_GT(resumed.metrics().at("test_acc"), 0.5);
  CommandResult logs = cluster_->Dtrain("logs " + id);
  EXPECT_THAT(logs.output, HasSubstr("the coordinator restarted while this job ran; it resumes "
                                     "from its last checkpoint " +
                                     checkpoint));
  EXPECT_THAT(logs.output, HasSubstr("resumed from "));
  // Lines from before the crash are still there.
  EXPECT_THAT(logs.output, HasSubstr("group formed"));
  std::printf("crashed at step %ld after checkpoint %s; resumed and ended at step %ld\n",
              static_cast<long>(step_at_crash), checkpoint.c_str(),
              static_cast<long>(resumed.progress().global_step()));
}

TEST_F(CoordinatorRestartTest, CheckpointGoneAfterRestart_JobFailsSayingSo) {
  const std::string id = Submit("lost", kEpochs);
  const std::string checkpoint = WaitForFirstCheckpoint(id);
  ASSERT_FALSE(checkpoint.empty());
  cluster_->StopCoordinator(SIGKILL);
  // The workers still run the job's step that fails without the coordinator, and can send no
  // further checkpoint: remove every copy there is, on the coordinator and in the workers'
  // caches.
  std::filesystem::remove_all(cluster_->dir() + "/state/artifacts/objects");
  for (const char* worker : {"w0", "w1"}) {
    std::filesystem::remove_all(absl::StrCat(cluster_->dir(), "/cache-", worker));
  }
  ASSERT_TRUE(cluster_->StartCoordinator(cluster_->address()));
  ASSERT_TRUE(
      WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(120)));
  const v1::JobStatus status = cluster_->GetJob(id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_THAT(status.reason(), HasSubstr(std::filesystem::path(checkpoint).filename().string()));
  EXPECT_THAT(status.reason(), HasSubstr("cannot resume after the coordinator restarted from "));
  std::printf("FAILED: %s\n", status.reason().c_str());
  // The workers are free for the next job.
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 2; }, absl::Seconds(15)));
}

}  // namespace coordinator_restart_test
}  // namespace dtrain::testing

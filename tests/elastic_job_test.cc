// Elastic jobs (trainer.min_nodes < num_nodes): a worker SIGKILLed mid-epoch does not end
// the job. The group re-forms in a new generation with the survivors plus an idle replacement
// when there is one (or fewer workers, down to min_nodes), resumes from the last checkpoint,
// and ends SUCCEEDED; with a replacement the world is unchanged and the job ends at exactly the
// step count of an uninterrupted run.
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// 4096 samples over 2 ranks in batches of 32: 64 optimizer steps per epoch.
constexpr int kEpochs = 4;
constexpr int64_t kStepsPerEpoch = 64;

class ElasticJobTest : public ::testing::Test {
 protected:
  void StartCluster(int workers) {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/elastic-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ASSERT_TRUE(cluster_->StartCoordinator());
    for (int i = 0; i < workers; ++i) ASSERT_TRUE(cluster_->AddWorker(absl::StrCat("w", i)));
    ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == workers; }, absl::Seconds(10)));
  }

  std::string SubmitElastic() {
    return cluster_->Submit("elastic", SyntheticDdpJob("elastic", kEpochs, 4096, ", min_nodes: 1",
                                                       "checkpoint: {save_top_k: 1}"));
  }

  // After the job's first checkpoint, SIGKILLs its second worker; returns that worker's name.
  std::string KillASecondWorkerAfterACheckpoint(const std::string& id) {
    EXPECT_TRUE(WaitFor(
        [&] {
          v1::JobStatus s = cluster_->GetJob(id);
          return !s.checkpoint().empty() || IsTerminal(s.state());
        },
        absl::Seconds(120)));
    const v1::JobStatus before = cluster_->GetJob(id);
    EXPECT_EQ(before.state(), v1::RUNNING) << "the job ended before the fault";
    if (before.workers_size() != 2) return "";
    const std::string victim = before.workers(1);
    cluster_->worker(victim).process().Kill(SIGKILL);
    return victim;
  }

  // Submits the elastic job, SIGKILLs one of its workers after its first checkpoint and waits
  // for the end; the job's final status, and the killed worker's name in `victim`.
  v1::JobStatus RunLosingAWorker(std::string* victim) {
    const std::string id = SubmitElastic();
    EXPECT_FALSE(id.empty());
    *victim = KillASecondWorkerAfterACheckpoint(id);
    EXPECT_FALSE(victim->empty());
    return WaitForEnd(id);
  }

  v1::JobStatus WaitForEnd(const std::string& id) {
    EXPECT_TRUE(
        WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(180)));
    return cluster_->GetJob(id);
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(ElasticJobTest, LostWorkerReplacedByAnIdleOne_ExactStepCount) {
  StartCluster(3);
  std::string victim;
  const v1::JobStatus done = RunLosingAWorker(&victim);
  const std::string id = done.id();
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.progress().global_step(), kEpochs * kStepsPerEpoch);
  EXPECT_EQ(done.workers_size(), 2);
  EXPECT_THAT(done.workers(), Not(Contains(victim)));
  EXPECT_GT(done.metrics().at("test_acc"), 0.5);
  const std::string log = cluster_->Dtrain("logs " + id).output;
  EXPECT_THAT(log, HasSubstr(absl::StrCat("lost worker(s) '", victim, "'")));
  EXPECT_THAT(log, HasSubstr("re-forming on"));
  EXPECT_THAT(log, HasSubstr("(restart 1 of 3), resuming from " + done.checkpoint()));
  EXPECT_THAT(log, HasSubstr("resumed from "));
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "lost worker") || absl::StrContains(line, "group formed") ||
        absl::StrContains(line, "resumed from")) {
      std::printf("%s\n", std::string(line.substr(0, 160)).c_str());
    }
  }
}

TEST_F(ElasticJobTest, NoReplacement_GoesOnWithTheSurvivor) {
  StartCluster(2);
  std::string victim;
  const v1::JobStatus done = RunLosingAWorker(&victim);
  const std::string id = done.id();
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_EQ(done.workers_size(), 1);
  EXPECT_NE(done.workers(0), victim);
  EXPECT_GE(done.progress().global_step(), kEpochs * kStepsPerEpoch);
  EXPECT_THAT(cluster_->Dtrain("logs " + id).output,
              HasSubstr(absl::StrCat("re-forming on '", done.workers(0), "' (restart 1 of 3)")));
}

}  // namespace
}  // namespace dtrain::testing

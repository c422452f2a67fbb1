// Elastic jobs (trainer.min_nodes < num_nodes): a worker SIGKILLed mid-epoch does not end
// the job. The group re-forms in a new generation with the survivors plus an idle replacement
// when there is one (or fewer workers, down to min_nodes), resumes from the last checkpoint,
// and ends SUCCEEDED. With a replacement the world is unchanged and the job ends in exactly the
// state of an uninterrupted run (step, weights and optimizer, bit for bit). With none it goes on
// in the smaller world from that checkpoint exactly as a job started there by ckpt_path with
// that world does (docs/jobs.md, "Elastic jobs").
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "tests/checkpoint_comparison.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace elastic_job_test {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// 4096 samples over 2 ranks in batches of 32: 64 optimizer steps per epoch; over the survivor
// alone, 128.
constexpr int kEpochs = 4;
constexpr int64_t kStepsPerEpoch = 64;
constexpr int64_t kStepsPerEpochAlone = 128;
constexpr char kLastCheckpoint[] = "checkpoint: {save_top_k: 1}";

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

  std::string SubmitElastic(const std::string& checkpoint) {
    return cluster_->Submit(
        "elastic", SyntheticDdpJob("elastic", kEpochs, 4096, ", min_nodes: 1", checkpoint));
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

  // Submits the elastic job with `checkpoint` (its checkpoint section), SIGKILLs one of its
  // workers after its first checkpoint and waits for the end; the job's final status, and the
  // killed worker's name in `victim`.
  v1::JobStatus RunLosingAWorker(std::string* victim,
                                 const std::string& checkpoint = kLastCheckpoint) {
    const std::string id = SubmitElastic(checkpoint);
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

TEST_F(ElasticJobTest, LostWorkerReplacedByAnIdleOne_EndsAsAnUninterruptedRun) {
  StartCluster(3);
  // The same job without the fault (min_nodes changes nothing while no worker is lost).
  const std::string reference = RunToTheEnd(
      *cluster_, "reference", SyntheticDdpJob("reference", kEpochs, 4096, "", kLastCheckpoint));
  ASSERT_FALSE(reference.empty());
  std::string victim;
  const v1::JobStatus done = RunLosingAWorker(&victim);
  const std::string id = done.id();
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.progress().global_step(), kEpochs * kStepsPerEpoch);
  EXPECT_TRUE(SameFinalState(*cluster_, id, reference));
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

// The world shrinks to 1, so the run is not the 2-rank one: the docs promise that the global
// step continues from the checkpoint over the smaller world's epochs, as ckpt_path in another
// world size does. Checked both ways: the exact step count that gives, and the final state of a
// 1-worker job started from the same checkpoint by ckpt_path.
TEST_F(ElasticJobTest, NoReplacement_GoesOnWithTheSurvivor_AsCkptPathInTheSmallerWorld) {
  StartCluster(2);
  std::string victim;
  // Every checkpoint kept (5 validations at most), so the one the job resumed from stays there.
  const v1::JobStatus done =
      RunLosingAWorker(&victim, "checkpoint: {monitor: val_loss, save_top_k: 8}");
  const std::string id = done.id();
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_EQ(done.workers_size(), 1);
  EXPECT_NE(done.workers(0), victim);
  const std::string log = cluster_->Dtrain("logs " + id).output;
  EXPECT_THAT(log,
              HasSubstr(absl::StrCat("re-forming on '", done.workers(0), "' (restart 1 of 3)")));
  // "resumed from job:<id>/epoch=E-step=S.ckpt at step S (epoch S / 128, batch S % 128)": the
  // 2-rank checkpoint's step counted in the survivor's 128-step epochs.
  const std::string prefix = absl::StrCat("resumed from job:", id, "/");
  const size_t at = log.find(prefix);
  ASSERT_NE(at, std::string::npos) << log;
  const std::string checkpoint =
      log.substr(at + prefix.size(), log.find(' ', at + prefix.size()) - at - prefix.size());
  const size_t step_at = checkpoint.find("-step=");
  ASSERT_NE(step_at, std::string::npos) << checkpoint;
  const int64_t step = std::stoll(checkpoint.substr(step_at + 6));
  EXPECT_EQ(step % kStepsPerEpoch, 0) << "the checkpoints are written at epoch ends";
  EXPECT_THAT(log, HasSubstr(absl::StrCat(prefix, checkpoint, " at step ", step, " (epoch ",
                                          step / kStepsPerEpochAlone, ", batch ",
                                          step % kStepsPerEpochAlone, ")")));
  // The run ends where the smaller world's max_epochs end.
  EXPECT_EQ(done.progress().global_step(), kEpochs * kStepsPerEpochAlone);
  // A 1-worker job from that checkpoint (job:<id>/<name>) ends in the same state, bit for bit.
  const std::string alone =
      RunToTheEnd(*cluster_, "alone",
                  absl::StrCat(absl::StrReplaceAll(SyntheticDdpJob("alone", kEpochs, 4096),
                                                   {{"num_nodes: 2", "num_nodes: 1"}}),
                               "ckpt_path: job:", id, "/", checkpoint, "\n"));
  ASSERT_FALSE(alone.empty());
  EXPECT_EQ(cluster_->GetJob(alone).progress().global_step(), kEpochs * kStepsPerEpochAlone);
  EXPECT_TRUE(SameFinalState(*cluster_, id, alone));
  std::printf("resumed from %s at step %lld on the survivor; ended at step %lld\n",
              checkpoint.c_str(), static_cast<long long>(step),
              static_cast<long long>(done.progress().global_step()));
}

}  // namespace elastic_job_test
}  // namespace dtrain::testing

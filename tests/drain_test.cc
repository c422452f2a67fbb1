// Graceful drain: a worker sent SIGTERM mid-job takes no new job, lets its step finish, and
// waits while the coordinator checkpoints the job at the next optimizer step and lets it go.
// The job then re-forms on an idle worker (a planned stop uses none of max_restarts), or, with
// none idle, waits in the queue and resumes when one joins. Either way it ends in exactly the
// state of an uninterrupted run of the same job (step count, weights and optimizer state, bit
// for bit), and the stopped worker exits 0 well before its timeout.
// A worker stopped while its job is still being set up is let go the same way. Where there is
// no checkpoint to take (a validate-only job), the drain timeout or a second signal ends the
// wait: the step stops, the worker leaves, and the job fails naming it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/job_spec.h"
#include "tests/checkpoint_comparison.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace drain_test {

using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// 32,768 samples over 2 ranks in batches of 32: 512 optimizer steps per epoch, 3 epochs. An
// epoch of 64 steps (4,096 samples) lasted ~60 ms, shorter than a SIGTERM's way to a checkpoint
// on a loaded machine, so the drain sometimes landed on the epoch-end checkpoint instead.
constexpr int kEpochs = 3;
constexpr int kTrainSize = 32768;
constexpr int64_t kStepsPerEpoch = 512;

// The step number in "...<prefix><N>..." of `text`; -1 if absent.
int64_t StepAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return -1;
  size_t end = at + prefix.size();
  while (end < text.size() && isdigit(static_cast<unsigned char>(text[end]))) ++end;
  int64_t step = -1;
  if (!absl::SimpleAtoi(text.substr(at + prefix.size(), end - at - prefix.size()), &step))
    return -1;
  return step;
}

class DrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/drain-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ASSERT_TRUE(cluster_->StartCoordinator());
  }

  // A worker whose stderr goes to <dir>/<name>.stderr.
  void AddWorker(const std::string& name, const std::string& drain_timeout = "60s") {
    const std::string log = StderrOf(name);
    ASSERT_TRUE(cluster_->AddWorker(name, {"--drain_timeout=" + drain_timeout},
                                    {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + log}));
  }
  // Workers `names`, all registered and alive.
  void StartWorkers(const std::vector<std::string>& names,
                    const std::string& drain_timeout = "60s") {
    for (const std::string& name : names) AddWorker(name, drain_timeout);
    const int n = static_cast<int>(names.size());
    ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == n; }, absl::Seconds(10)));
  }
  std::string StderrOf(const std::string& name) const {
    return absl::StrCat(cluster_->dir(), "/", name, ".stderr");
  }

  // Submits the (not elastic, no restarts allowed) job and, some steps into its first epoch
  // (before any epoch-end checkpoint), sends SIGTERM to its second worker; that worker's name.
  std::string SubmitAndStopAWorker(std::string* id) {
    *id = cluster_->Submit("drain",
                           SyntheticDdpJob("drain", kEpochs, kTrainSize, ", max_restarts: 0"));
    EXPECT_FALSE(id->empty());
    EXPECT_TRUE(WaitFor(
        [&] {
          const v1::JobStatus s = cluster_->GetJob(*id);
          return s.progress().global_step() >= 8 || IsTerminal(s.state());
        },
        absl::Seconds(120)));
    const v1::JobStatus before = cluster_->GetJob(*id);
    EXPECT_EQ(before.state(), v1::RUNNING) << before.reason();
    EXPECT_TRUE(before.checkpoint().empty()) << "a checkpoint before the drain proves nothing";
    if (before.workers_size() != 2) return "";
    const std::string victim = before.workers(1);
    stop_sent_ = absl::Now();
    cluster_->worker(victim).process().Kill(SIGTERM);
    return victim;
  }

  // The stopped worker exits 0, within `within` of its SIGTERM; how long it took.
  absl::Duration ExpectCleanExit(const std::string& victim, absl::Duration within) {
    const int status = cluster_->worker(victim).process().Wait(absl::Seconds(90));
    const absl::Duration took = absl::Now() - stop_sent_;
    EXPECT_NE(status, -1) << victim << " did not exit";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_LT(took, within);
    std::printf("worker %s exited %.2f s after SIGTERM\n", victim.c_str(),
                absl::ToDoubleSeconds(took));
    return took;
  }

  // A validate-only job (the cnn over 40,000 samples, seconds here): nothing to checkpoint, so
  // a drain cannot be taken early. Some of it validated, SIGTERM goes to its second worker;
  // that worker's name.
  std::string SubmitValidationAndStopAWorker(std::string* id) {
    // The cnn, whose forward costs ~10x the mlp's a sample, validates 40,000 samples for longer
    // (7 s here) than the mlp did 200,000 (2.3 s), from a fifth of the samples to generate at
    // Setup.
    *id = cluster_->Submit("validate-only", R"(name: validate-only
model: {builtin: cnn}
data:
  synthetic: {train_size: 256, val_size: 40000, test_size: 256, seed: 3}
  batch_size: 32
  eval_batch_size: 16          # 1,250 batches a rank: validation outlasts a 1 s drain timeout
trainer: {strategy: ddp, num_nodes: 2}
seed_everything: 1
)",
                           "validate");
    EXPECT_FALSE(id->empty());
    EXPECT_TRUE(WaitFor(
        [&] {
          const v1::JobStatus s = cluster_->GetJob(*id);
          return s.progress().phase() == "validate" || IsTerminal(s.state());
        },
        absl::Seconds(60)));
    const v1::JobStatus before = cluster_->GetJob(*id);
    EXPECT_EQ(before.state(), v1::RUNNING) << before.reason();
    if (before.workers_size() != 2) return "";
    const std::string victim = before.workers(1);
    stop_sent_ = absl::Now();
    cluster_->worker(victim).process().Kill(SIGTERM);
    return victim;
  }

  // The job the stopped worker left ends FAILED naming it, and the other worker is free again.
  void ExpectFailedNaming(const std::string& id, const std::string& victim) {
    const v1::JobStatus done = WaitForEnd(id);
    EXPECT_EQ(done.state(), v1::FAILED);
    EXPECT_THAT(done.reason(), HasSubstr(absl::StrCat("worker '", victim, "'")));
    EXPECT_THAT(done.reason(), HasSubstr("shutting down"));
    EXPECT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 1; }, absl::Seconds(20)));
    std::printf("FAILED: %s\n", done.reason().c_str());
  }

  v1::JobStatus WaitForEnd(const std::string& id) {
    EXPECT_TRUE(
        WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(180)));
    return cluster_->GetJob(id);
  }

  // The same job run without a drain, to its end, on the cluster's first two workers; its id.
  std::string RunUninterrupted(int epochs = kEpochs) {
    return RunToTheEnd(*cluster_, "reference", SyntheticDdpJob("reference", epochs, kTrainSize));
  }

  // The job checkpointed at a step inside the first epoch, resumed there, and ended in the state
  // of `reference`, the uninterrupted run.
  void ExpectResumedAtTheDrainCheckpoint(const v1::JobStatus& done, const std::string& victim,
                                         const std::string& reference) {
    const std::string log = cluster_->Dtrain("logs " + done.id()).output;
    EXPECT_THAT(log, HasSubstr(absl::StrCat("worker(s) '", victim, "' are stopping")));
    const int64_t at = StepAfter(log, "are stopping: checkpointing at step ");
    EXPECT_GT(at, 0);
    EXPECT_LT(at, kStepsPerEpoch);
    EXPECT_EQ(StepAfter(log, "stopped (drained); checkpointed at step "), at);
    EXPECT_THAT(log, HasSubstr(absl::StrCat("resumed from ", done.checkpoint(), " at step ", at,
                                            " (epoch 0, batch ", at, ")")));
    EXPECT_THAT(log, Not(HasSubstr("lost worker")));
    EXPECT_EQ(done.progress().global_step(), kEpochs * kStepsPerEpoch);
    EXPECT_GT(done.metrics().at("test_acc"), 0.5);
    EXPECT_TRUE(SameFinalState(*cluster_, done.id(), reference));
    // The worker waited for the checkpoint rather than stopping its step.
    const std::string stderr_text = ReadFile(StderrOf(victim));
    EXPECT_THAT(stderr_text, HasSubstr("waiting for the coordinator to checkpoint the job"));
    EXPECT_THAT(stderr_text, Not(HasSubstr("drain timeout")));
    std::printf("drained at step %lld; the job ended at step %lld\n", static_cast<long long>(at),
                static_cast<long long>(done.progress().global_step()));
  }

  std::unique_ptr<LocalCluster> cluster_;
  absl::Time stop_sent_;
};

TEST_F(DrainTest, StoppedWorkerReplacedByAnIdleOne_NoRestartUsed_EndsAsAnUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"w0", "w1", "w2"}));
  const std::string reference = RunUninterrupted();
  ASSERT_FALSE(reference.empty());
  std::string id;
  const std::string victim = SubmitAndStopAWorker(&id);
  ASSERT_FALSE(victim.empty());
  ExpectCleanExit(victim, absl::Seconds(50));
  const v1::JobStatus done = WaitForEnd(id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.workers_size(), 2);
  EXPECT_THAT(done.workers(), Not(Contains(victim)));
  EXPECT_THAT(cluster_->Dtrain("logs " + id).output, HasSubstr("re-forming on"));
  ExpectResumedAtTheDrainCheckpoint(done, victim, reference);
}

TEST_F(DrainTest, NoIdleWorker_JobWaitsQueued_ResumesWhenOneJoins) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"w0", "w1"}));
  const std::string reference = RunUninterrupted();
  ASSERT_FALSE(reference.empty());
  std::string id;
  const std::string victim = SubmitAndStopAWorker(&id);
  ASSERT_FALSE(victim.empty());
  ExpectCleanExit(victim, absl::Seconds(50));
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->GetJob(id).state() == v1::QUEUED; }, absl::Seconds(20)));
  const v1::JobStatus waiting = cluster_->GetJob(id);
  EXPECT_EQ(waiting.progress().phase(), "waiting to resume");
  EXPECT_THAT(waiting.checkpoint(), HasSubstr("last.ckpt"));
  EXPECT_THAT(cluster_->Dtrain("logs " + id).output,
              HasSubstr("the job waits in the queue and resumes from " + waiting.checkpoint()));
  // It stays queued while one worker is idle (the scheduler sees that worker at every tick, so
  // 2 s is a hundred chances to place the job wrongly), and takes the next one that joins.
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->AliveWorkers(/*idle_only=*/true) == 1; }, absl::Seconds(20)))
      << "the remaining worker was not let go";
  EXPECT_FALSE(
      WaitFor([&] { return cluster_->GetJob(id).state() != v1::QUEUED; }, absl::Seconds(2)))
      << v1::JobState_Name(cluster_->GetJob(id).state()) << " with one idle worker of two";
  AddWorker("w2");
  const v1::JobStatus done = WaitForEnd(id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_THAT(done.workers(), Contains("w2"));
  EXPECT_THAT(done.workers(), Not(Contains(victim)));
  ExpectResumedAtTheDrainCheckpoint(done, victim, reference);
}

// SIGTERM while the job is still being set up (its group not yet formed): the Setup runs, the
// job counts as the worker's, and the trainer lets it go at step 0 onto the idle worker.
TEST_F(DrainTest, StoppedDuringSetup_LetGoAtStepZero_EndsAsAnUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"w0", "w1", "w2"}));
  // The same training without the 150,000 validation samples that slow this job's Setup down:
  // validation reads the weights and changes nothing (the mlp has no batch statistics).
  const std::string reference = RunUninterrupted(2);
  ASSERT_FALSE(reference.empty());
  // 150,000 validation samples to generate make Setup take seconds (3 s alone here, more beside
  // other tests); two batches are validated.
  const std::string id = cluster_->Submit(
      "slow-setup",
      absl::StrReplaceAll(SyntheticDdpJob("slow-setup", 2, kTrainSize, ", limit_val_batches: 2"),
                          {{"val_size: 256", "val_size: 150000"}}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor([&] { return cluster_->GetJob(id).workers_size() == 2; }, absl::Seconds(20)));
  const std::string victim = cluster_->GetJob(id).workers(1);
  ASSERT_THAT(cluster_->Dtrain("logs " + id).output, Not(HasSubstr("group formed")))
      << "the group formed before the signal: this machine set the job up too fast";
  stop_sent_ = absl::Now();
  cluster_->worker(victim).process().Kill(SIGTERM);
  ExpectCleanExit(victim, absl::Seconds(40));
  const v1::JobStatus done = WaitForEnd(id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_THAT(done.workers(), Not(Contains(victim)));
  const std::string log = cluster_->Dtrain("logs " + id).output;
  // Either the worker held the Setup when the signal came (it runs, then the job lets the worker
  // go at step 0), or the signal came first and the worker refused the Setup: a drain either way.
  const std::string held =
      absl::StrCat("worker(s) '", victim, "' are stopping: checkpointing at step 0");
  EXPECT_THAT(log, AnyOf(HasSubstr(held), HasSubstr(absl::StrCat("worker(s) ", victim,
                                                                 " stopped before the job was "
                                                                 "set up"))));
  EXPECT_THAT(log, HasSubstr("re-forming on"));
  EXPECT_EQ(done.progress().global_step(), 2 * kStepsPerEpoch);
  EXPECT_TRUE(SameFinalState(*cluster_, id, reference));
  // Holding the Setup, the worker waited for the job to let it go; with no job yet, it had
  // nothing to wait for (about 1 run in 7 here: the Setup RPC had not reached it).
  EXPECT_THAT(
      ReadFile(StderrOf(victim)),
      HasSubstr(absl::StrContains(log, held) ? "waiting for the coordinator to checkpoint the job"
                                             : "stopping: no job here"));
}

// Nothing to checkpoint: the worker waits out --drain_timeout, then stops its step and leaves.
TEST_F(DrainTest, ValidationOnly_DrainTimeoutStopsTheStep_JobFailsNamingTheWorker) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"w0", "w1"}, "1s"));
  std::string id;
  const std::string victim = SubmitValidationAndStopAWorker(&id);
  ASSERT_FALSE(victim.empty());
  const absl::Duration took = ExpectCleanExit(victim, absl::Seconds(10));
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_THAT(ReadFile(StderrOf(victim)), HasSubstr("drain timeout: stopping the job's step now"));
  ExpectFailedNaming(id, victim);
}

// A second SIGTERM cuts the 60 s drain wait short.
TEST_F(DrainTest, ValidationOnly_SecondSignalStopsAtOnce_JobFailsNamingTheWorker) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"w0", "w1"}));
  std::string id;
  const std::string victim = SubmitValidationAndStopAWorker(&id);
  ASSERT_FALSE(victim.empty());
  ASSERT_TRUE(WaitFor(
      [&] { return absl::StrContains(ReadFile(StderrOf(victim)), "waiting for the coordinator"); },
      absl::Seconds(10)));
  // The coordinator knows the worker is draining (it lists it so), and the job still runs: the
  // first signal alone does not end it, for as long as the drain timeout (60 s) lasts; 1 s of
  // that is watched.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string listed = cluster_->Dtrain("workers").output;
        const size_t at = listed.find(victim + " ");
        return at != std::string::npos &&
               listed.substr(at, listed.find('\n', at) - at).find("DRAINING") != std::string::npos;
      },
      absl::Seconds(10)))
      << cluster_->Dtrain("workers").output;
  EXPECT_FALSE(
      WaitFor([&] { return cluster_->GetJob(id).state() != v1::RUNNING; }, absl::Seconds(1)))
      << "the first signal alone ended the job: " << cluster_->GetJob(id).reason();
  stop_sent_ = absl::Now();
  cluster_->worker(victim).process().Kill(SIGTERM);
  ExpectCleanExit(victim, absl::Seconds(10));
  EXPECT_THAT(ReadFile(StderrOf(victim)), HasSubstr("second signal: stopping the job's step now"));
  ExpectFailedNaming(id, victim);
}

// A worker without a job has nothing to drain: it exits at once and leaves the list.
TEST_F(DrainTest, IdleWorker_ExitsAtOnce_AndIsUnregistered) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"w0", "w1"}));
  stop_sent_ = absl::Now();
  cluster_->worker("w1").process().Kill(SIGTERM);
  ExpectCleanExit("w1", absl::Seconds(5));
  EXPECT_THAT(ReadFile(StderrOf("w1")), HasSubstr("stopping: no job here"));
  EXPECT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 1; }, absl::Seconds(5)));
}

}  // namespace drain_test
}  // namespace dtrain::testing

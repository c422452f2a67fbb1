// Lightning's Trainer flags that shape the loops, on a fake worker group: limit_*_batches as
// counts and fractions, fast_dev_run, overfit_batches and the sanity check (num_sanity_val_steps).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "coordinator/jobs/testing/fake_worker_group.h"
#include "coordinator/jobs/trainer.h"
#include "tests/trainer_fixture.h"

namespace dtrain {
namespace trainer_flags_test {

using ::testing::HasSubstr;

// 64 samples in each split: 4 training and 4 evaluation batches of 8 per rank.
FakeWorkerGroupOptions EvenSplits() {
  FakeWorkerGroupOptions fake;
  fake.splits = {{"train", 64}, {"val", 64}, {"test", 64}};
  return fake;
}

// The first call of `what` among the group's calls, or -1.
int Position(const FakeWorkerGroup& group, const std::string& what) {
  for (size_t i = 0; i < group.calls().size(); ++i) {
    if (group.calls()[i].what == what) return static_cast<int>(i);
  }
  return -1;
}

TEST_F(TrainerTest, LimitTrainBatches_CountAndFractionCapEachEpoch) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_limit_train_batches(3);
  auto trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  // 3 epochs x 3 batches x 2 ranks, and one optimizer step per batch.
  EXPECT_EQ(group().trained().size(), 18u);
  EXPECT_EQ(group().global_step(), 9);

  spec.mutable_trainer()->set_limit_train_fraction(0.5);  // of 4: 2
  trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().global_step(), 6);
  // The batches an epoch trains are its shuffled order's first ones, as a DataLoader's.
  const std::vector<testing::TrainedBatch> all = Expected(spec, 3);
  ASSERT_EQ(group().trained().size(), 12u);
  EXPECT_EQ(group().trained()[0].indices, all[0].indices);
  EXPECT_EQ(group().trained()[4].indices, all[8].indices);  // epoch 1's first batch
}

TEST_F(TrainerTest, LimitTrainFraction_BelowOneBatch_RefusedNamingTheSmallestShare) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_limit_train_fraction(0.1);  // of 4 batches: none
  auto trainer = Make(spec, EvenSplits());
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("trainer.limit_train_batches: 0.1 of 4 batches"));
  EXPECT_THAT(status.message(), HasSubstr("give at least 0.25"));
}

TEST_F(TrainerTest, LimitTrainBatches_Zero_FitTrainsNothingAndTheTestRuns) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_limit_train_batches(0);
  auto trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().count("training_step"), 0);
  EXPECT_EQ(group().count("validation_step"), 0);
  EXPECT_EQ(group().count("test_step"), 1);
  EXPECT_EQ(record_.Lines("training is off (trainer.limit_train_batches: 0)"), 1);
}

TEST_F(TrainerTest, LimitValAndTestFractions_TakeThatShareOfEachRanksBatches) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(1);
  spec.mutable_trainer()->set_limit_val_fraction(0.5);
  spec.mutable_trainer()->set_limit_test_fraction(0.75);
  auto trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  // One validation of 2 of 4 batches, then the test of 3 of 4.
  EXPECT_EQ(group().evaluated(), (std::vector<int64_t>{2, 3}));

  spec.mutable_trainer()->set_limit_val_fraction(0);
  trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 0);
  EXPECT_EQ(record_.Lines("validation is off (trainer.limit_val_batches: 0)"), 1);
}

// fast_dev_run: 2 runs 2 batches of each loop in one epoch, with no sanity check, no checkpoint
// and no early stopping, whatever the spec says of them.
TEST_F(TrainerTest, FastDevRun_TwoBatchesOfEachLoop_OneEpoch_NoCheckpoint) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_fast_dev_run(2);
  spec.mutable_trainer()->set_num_sanity_val_steps(2);
  spec.mutable_trainer()->set_limit_val_batches(4);
  spec.mutable_checkpoint()->set_every_n_steps(1);
  spec.mutable_early_stopping()->set_monitor("val_loss");
  auto trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().global_step(), 2);
  EXPECT_EQ(group().trained().size(), 4u);
  EXPECT_EQ(group().count("sanity_check"), 0);
  EXPECT_EQ(group().evaluated(), (std::vector<int64_t>{2, 2}));  // validation, test
  EXPECT_EQ(group().count("save_checkpoint"), 0);
  EXPECT_EQ(record_.Lines("fast_dev_run: 2 batch(es) of each loop, one epoch, no checkpoint"), 1);
}

// overfit_batches: 2 trains the same first 2 batches, unshuffled, every epoch, and validates on
// 2 batches.
TEST_F(TrainerTest, OverfitBatches_SameUnshuffledBatchesEveryEpoch) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_overfit_batches(2);
  auto trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  const std::vector<testing::TrainedBatch>& trained = group().trained();
  ASSERT_EQ(trained.size(), 12u);  // 3 epochs x 2 batches x 2 ranks
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(trained[i].indices, trained[i + 4].indices);
    EXPECT_EQ(trained[i].indices, trained[i + 8].indices);
  }
  // Rank 0's first batch in DistributedSampler's unshuffled order: 0, 2, 4, ...
  EXPECT_EQ(trained[0].indices, (std::vector<int64_t>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(group().evaluated(), (std::vector<int64_t>{2, 2, 2, 4}));  // 3 validations, test
}

// The sanity check (Lightning's default of 2) runs before the first training step; what it
// measures is not logged and no callback acts on it.
TEST_F(TrainerTest, SanityCheck_RunsFirst_KeepsNothing_MinusOneRunsAll) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->clear_num_sanity_val_steps();  // Lightning's default, 2
  auto trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().count("sanity_check"), 1);
  EXPECT_LT(Position(group(), "sanity_check"), Position(group(), "training_step"));
  ASSERT_EQ(group().evaluated().size(), 5u);  // sanity, 3 validations, test
  EXPECT_EQ(group().evaluated()[0], 2);
  EXPECT_EQ(record_.Named("val_loss").size(), 3u);  // one per epoch, none from the check
  EXPECT_EQ(record_.Lines("sanity check: 2 validation batch(es) per rank ran"), 1);

  spec.mutable_trainer()->set_num_sanity_val_steps(-1);
  trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().evaluated()[0], 4);

  // Off when validation is.
  spec.mutable_trainer()->set_limit_val_batches(0);
  trainer = Make(spec, EvenSplits());
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("sanity_check"), 0);
}

// A run that starts from a checkpoint runs no sanity check, as Lightning's restarting loops.
TEST_F(TrainerTest, SanityCheck_NotOnAResumedRun) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(1);
  ASSERT_TRUE(Make(spec, EvenSplits())->Run().ok());
  spec.mutable_trainer()->set_max_epochs(2);
  spec.mutable_trainer()->set_num_sanity_val_steps(2);
  spec.set_ckpt_path("job:job-1/last.ckpt");
  auto resumed = Make(spec, EvenSplits());
  ASSERT_TRUE(resumed->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().count("training_step"), 4);  // the second epoch
  EXPECT_EQ(group().count("sanity_check"), 0);
}

TEST_F(TrainerTest, SanityCheck_Fails_NamingTheSettingThatSkipsIt) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_num_sanity_val_steps(2);
  FakeWorkerGroupOptions fake = EvenSplits();
  fake.before_call = [](const FakeCall& call) {
    return call.what == "sanity_check"
               ? absl::InvalidArgumentError("validation_step: shape mismatch on rank 1")
               : absl::OkStatus();
  };
  auto trainer = Make(spec, fake);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("sanity check (trainer.num_sanity_val_steps: 2; 0 skips it): "));
  EXPECT_THAT(status.message(), HasSubstr("validation_step: shape mismatch on rank 1"));
  EXPECT_EQ(group().count("training_step"), 0);
}

// Lightning's default of 50 over epochs of 4 batches: said once in the log, as Lightning warns.
TEST_F(TrainerTest, LogEveryNSteps_AboveAnEpochsBatches_SaidInTheLog) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_log_every_n_steps(50);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(record_.Lines("the number of training batches (4) is smaller than the logging "
                          "interval trainer.log_every_n_steps (50)"),
            1);
  spec.mutable_trainer()->set_log_every_n_steps(4);
  trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(record_.Lines("is smaller than the logging interval"), 1);  // the first run's only
}

}  // namespace trainer_flags_test
}  // namespace dtrain

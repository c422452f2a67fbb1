// Lightning's ModelCheckpoint and EarlyStopping in the trainer, driven in-process against
// FakeWorkerGroup (trainer_fixture.h): top-k by a monitored metric across runs, filename
// templates, every_n_epochs, save_top_k -1 and 0, a monitored training epoch value with
// validation off, and early stopping by patience, min_epochs, thresholds and non-finite values.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/checkpoint_filename.h"
#include "tests/trainer_fixture.h"

namespace dtrain {
namespace trainer_callbacks_test {

TEST_F(TrainerTest, EarlyStopping_NoImprovementForPatience_StopsAfterThatValidation) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(10);
  spec.mutable_early_stopping()->set_monitor("val_loss");
  spec.mutable_early_stopping()->set_patience(2);
  FakeWorkerGroupOptions fake;
  // Rank 0 stalls from the first validation; rank 1 keeps improving, but one rank's verdict
  // stops the group (reduce_boolean_decision, any).
  fake.validation_metrics = [](int validation, int rank) -> std::map<std::string, double> {
    return {{"loss", rank == 0 ? 1.0 : 1.0 / (validation + 1)}};
  };
  auto trainer = Make(spec, fake);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 3);
  EXPECT_EQ(group().count("reduce_boolean_decision"), 3);
  EXPECT_EQ(group().global_step(), 12);
  EXPECT_EQ(record_.Lines("early stopping: val_loss did not improve by 0 for 2 validations"), 1);
  EXPECT_EQ(record_.Lines("epoch 2 done"), 1);
  EXPECT_EQ(record_.Lines("epoch 3 done"), 0);
  EXPECT_EQ(group().count("test_step"), 1);  // the test still runs after an early stop
}

// min_epochs holds early stopping back: the same stalled metric as above stops after epoch 2
// without it, and after epoch 4 (the 4th validation) with min_epochs 4.
TEST_F(TrainerTest, EarlyStopping_WaitsForMinEpochs) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(10);
  spec.mutable_trainer()->set_min_epochs(4);
  spec.mutable_early_stopping()->set_monitor("val_loss");
  spec.mutable_early_stopping()->set_patience(2);
  FakeWorkerGroupOptions fake;
  fake.validation_metrics = [](int, int) -> std::map<std::string, double> {
    return {{"loss", 1.0}};
  };
  auto trainer = Make(spec, fake);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 4);
  EXPECT_EQ(group().global_step(), 16);
  EXPECT_EQ(record_.Lines("early stopping waits for trainer.min_epochs 4"), 1);
  EXPECT_EQ(record_.Lines("epoch 3 done"), 1);
  EXPECT_EQ(record_.Lines("epoch 4 done"), 0);
}

TEST_F(TrainerTest, TopK_MonitoredMin_KeepsTheBestTwoEvictsTheRestAndTestsTheBest) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(4);
  spec.mutable_trainer()->set_test_ckpt_path("best");
  spec.mutable_checkpoint()->set_monitor("val_loss");
  spec.mutable_checkpoint()->set_save_top_k(2);
  auto trainer = Make(spec, ValidationLosses({0.5, 0.3, 0.4, 0.2}));
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_THAT(store_.names(),
              UnorderedElementsAre("epoch=1-step=8.ckpt", "epoch=3-step=16.ckpt", "last.ckpt"));
  EXPECT_THAT(record_.dropped, ElementsAre("epoch=0-step=4.ckpt", "epoch=2-step=12.ckpt"));
  EXPECT_EQ(record_.best, "job:job-1/epoch=3-step=16.ckpt");
  std::map<std::string, double> monitored;
  for (const v1::JobFile& f : record_.kept) {
    if (f.has_monitored()) monitored[f.name()] = f.monitored();
  }
  EXPECT_DOUBLE_EQ(monitored.at("epoch=1-step=8.ckpt"), 0.3);
  EXPECT_DOUBLE_EQ(monitored.at("epoch=3-step=16.ckpt"), 0.2);
  // The best is not the last save (last.ckpt at the end of fit), so the test loads it.
  EXPECT_EQ(record_.Lines("testing the best checkpoint job:job-1/epoch=3-step=16.ckpt"), 1);
  EXPECT_EQ(group().count("load_checkpoint"), 1);
}

TEST_F(TrainerTest, TopK_NewRun_CarriesOnFromTheFilesTheJobKept) {
  v1::JobFile kept;
  kept.set_name("epoch=0-step=4.ckpt");
  kept.set_kind("checkpoint");
  kept.set_monitored(0.1);
  files_ = {kept};
  v1::JobSpec spec = Spec();
  spec.mutable_checkpoint()->set_monitor("val_loss");
  FakeWorkerGroupOptions fake;
  fake.validation_metrics = [](int, int) -> std::map<std::string, double> {
    return {{"loss", 0.5}};
  };
  auto trainer = Make(spec, fake);
  ASSERT_TRUE(trainer->Run().ok());
  // No validation beats 0.1, so nothing new is kept by the monitor.
  for (const v1::JobFile& f : record_.kept) EXPECT_FALSE(f.has_monitored()) << f.name();
  EXPECT_EQ(record_.best, "job:job-1/epoch=0-step=4.ckpt");
}

// ModelCheckpoint's filename template, every_n_epochs and save_top_k: -1, as Lightning's.
TEST_F(TrainerTest, Checkpoint_FilenameTemplate_EveryNEpochs_KeepAll) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(4);
  spec.mutable_checkpoint()->set_monitor("val_loss");
  spec.mutable_checkpoint()->set_save_top_k(-1);
  spec.mutable_checkpoint()->set_every_n_epochs(2);
  spec.mutable_checkpoint()->set_filename("{epoch:02d}-{val_loss:.2f}-{missing}");
  auto trainer = Make(spec, ValidationLosses({0.5, 0.3, 0.4, 0.2}));
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  // Epochs 1 and 3 (every second), both kept; a metric the run never logged formats as 0.
  EXPECT_THAT(store_.names(),
              UnorderedElementsAre("epoch=01-val_loss=0.30-missing=0.ckpt",
                                   "epoch=03-val_loss=0.20-missing=0.ckpt", "last.ckpt"));
  EXPECT_TRUE(record_.dropped.empty());
  EXPECT_EQ(record_.best, "job:job-1/epoch=03-val_loss=0.20-missing=0.ckpt");
}

// With validation off, a monitored training epoch value (self.log with on_epoch) picks the
// checkpoints at each epoch's end; its _step points follow log_every_n_steps.
TEST_F(TrainerTest, Checkpoint_MonitorsATrainingEpochValue_WhenValidationIsOff) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_limit_val_batches(0);
  spec.mutable_checkpoint()->set_monitor("train_acc_epoch");
  spec.mutable_checkpoint()->set_mode("max");
  spec.mutable_checkpoint()->set_filename("best-{epoch}-{train_acc_epoch:.3f}");
  spec.mutable_checkpoint()->set_auto_insert_metric_name(false);
  // Epoch accuracy 0.5, 0.8, 0.6: rank 1's batches weigh as much as rank 0's.
  const std::vector<double> acc = {0.5, 0.8, 0.6};
  auto trainer = Make(spec, LoggedEachBatch("train_acc", [&](int64_t epoch, int rank) {
                        return acc[epoch] + (rank == 0 ? -0.1 : 0.1);
                      }));
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_THAT(store_.names(), UnorderedElementsAre("best-1-0.800.ckpt", "last.ckpt"));
  EXPECT_THAT(record_.dropped, ElementsAre("best-0-0.500.ckpt"));
  const std::vector<Point> epochs = record_.Named("train_acc_epoch");
  ASSERT_EQ(epochs.size(), 3u);
  for (int e = 0; e < 3; ++e) EXPECT_NEAR(epochs[e].value, acc[e], 1e-12);
  // Rank 0's value, at every second step of 12 (4 steps an epoch, one batch a call).
  const std::vector<Point> steps = record_.Named("train_acc_step");
  ASSERT_EQ(steps.size(), 6u);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, 2 * static_cast<int64_t>(i + 1));
    EXPECT_NEAR(steps[i].value, acc[(steps[i].step - 1) / 4] - 0.1, 1e-12);
  }
  EXPECT_TRUE(record_.Named("train_acc").empty());
}

TEST_F(TrainerTest, Checkpoint_SaveTopKZero_OnlyLast_AndAMonitorNobodyLogsIsNamed) {
  v1::JobSpec spec = Spec();
  spec.mutable_checkpoint()->set_monitor("val_loss");
  spec.mutable_checkpoint()->set_save_top_k(0);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_THAT(store_.names(), UnorderedElementsAre("last.ckpt"));

  v1::JobSpec unknown = Spec();
  unknown.mutable_checkpoint()->set_monitor("val_f1");
  trainer = Make(unknown);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("'val_f1' is neither a validation metric nor a training epoch value"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("val_loss"));
}

TEST(CheckpointFilename, BadTemplatesRefusedAtSubmission_GoodOnesFormatAsPython) {
  for (const char* bad : {"{epoch", "epoch}", "a/b", "{val_loss:.2x}", "last", "../x", "{}",
                          "{a{b}}", "best ckpt", ".hidden", "a+b"}) {
    v1::JobSpec spec = Spec();
    spec.mutable_checkpoint()->set_filename(bad);
    const absl::Status status = NormalizeJobSpec(&spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), HasSubstr("checkpoint.filename")) << bad;
  }
  const std::map<std::string, double> values = {
      {"epoch", 3}, {"step", 120}, {"val_loss", 0.123456}, {"lr-AdamW/pg1", 0.001}};
  // format(0.123456, ".2f") == "0.12"; format(3, "03d") == "003"; format(0.001, ".1e").
  EXPECT_EQ(FormatCheckpointFilename("{epoch:03d}-{val_loss:.2f}-{lr-AdamW/pg1:.1e}", values, true),
            "epoch=003-val_loss=0.12-lr-AdamW_pg1=1.0e-03.ckpt");
  EXPECT_EQ(FormatCheckpointFilename("", values, true), "epoch=3-step=120.ckpt");
  EXPECT_EQ(FormatCheckpointFilename("{val_loss}", values, false), "0.123456.ckpt");
  EXPECT_EQ(FormatCheckpointFilename("{big:.1e}", {{"big", 2500}}, true), "big=2.5e_03.ckpt");
}

// EarlyStopping's stopping_threshold, divergence_threshold and check_finite, each named in
// the log, each stopping after the validation that crossed it.
TEST_F(TrainerTest, EarlyStopping_Thresholds_AndANonFiniteValue) {
  struct Case {
    std::function<void(v1::EarlyStoppingConfig*)> set;
    std::vector<double> losses;
    int validations;
    std::string said;
  };
  const std::vector<Case> cases = {
      {[](v1::EarlyStoppingConfig* e) { e->set_stopping_threshold(0.25); },
       {0.5, 0.3, 0.2, 0.1, 0.05},
       3,
       "val_loss = 0.2 reached the stopping threshold 0.25 (rank 0)"},
      {[](v1::EarlyStoppingConfig* e) { e->set_divergence_threshold(1.0); },
       {0.5, 0.7, 1.5, 0.4, 0.3},
       3,
       "val_loss = 1.5 is worse than the divergence threshold 1 (rank 0)"},
      {[](v1::EarlyStoppingConfig*) {},
       {0.5, std::nan(""), 0.2, 0.1, 0.05},
       2,
       "val_loss is nan, not a finite number (rank 0)"},
  };
  for (const Case& c : cases) {
    record_ = Record();
    v1::JobSpec spec = Spec();
    spec.mutable_trainer()->set_max_epochs(5);
    spec.mutable_early_stopping()->set_monitor("val_loss");
    spec.mutable_early_stopping()->set_patience(10);
    c.set(spec.mutable_early_stopping());
    auto trainer = Make(spec, ValidationLosses(c.losses));
    ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
    EXPECT_EQ(group().count("validation_step"), c.validations) << c.said;
    EXPECT_EQ(record_.Lines("early stopping: " + c.said), 1) << absl::StrJoin(record_.lines, "\n");
  }
}

// A monitored training epoch value stops fit at an epoch's end when validation is off, as
// Lightning's EarlyStopping checks on train epoch end without a validation loop.
TEST_F(TrainerTest, EarlyStopping_OnATrainingEpochValue_WhenValidationIsOff) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(6);
  spec.mutable_trainer()->set_limit_val_batches(0);
  spec.mutable_early_stopping()->set_monitor("train_loss_epoch");
  spec.mutable_early_stopping()->set_patience(2);
  // The epoch loss falls, then stalls from epoch 1 on: epochs 2 and 3 do not improve.
  const std::vector<double> loss = {1.0, 0.5, 0.6, 0.55, 0.4, 0.3};
  auto trainer = Make(
      spec, LoggedEachBatch("train_loss", [&](int64_t epoch, int rank) { return loss[epoch]; }));
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().global_step(), 16) << "4 epochs of 4 steps";
  EXPECT_EQ(record_.Lines("early stopping: train_loss_epoch did not improve by 0 for 2 "
                          "validations (rank 0)"),
            1);
  EXPECT_EQ(record_.Named("train_loss_epoch").size(), 4u);

  // A monitor nobody logs is named, with what the run has.
  v1::JobSpec unknown = Spec();
  unknown.mutable_early_stopping()->set_monitor("val_f1");
  trainer = Make(unknown);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("early_stopping.monitor: 'val_f1' is neither a validation metric"));
}

}  // namespace trainer_callbacks_test
}  // namespace dtrain

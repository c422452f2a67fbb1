// The trainer's loops and callbacks, driven in-process against FakeWorkerGroup with a clock the
// test advances: epochs and steps, validation intervals, accumulation, max_steps, early
// stopping, top-k checkpoints, resume mid-epoch (bit-identical to an uninterrupted run), a
// worker lost mid-call, drain, cancel, predict, and what the loggers report. No processes, no
// gRPC, no sleeps: the real workers run the same loops in jobs_e2e_test and its neighbours.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_filename.h"
#include "common/job_spec.h"
#include "coordinator/jobs/distributed_sampler.h"
#include "coordinator/jobs/metric_names.h"
#include "coordinator/jobs/testing/fake_worker_group.h"
#include "coordinator/jobs/trainer.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using testing::FakeCall;
using testing::FakeCheckpointStore;
using testing::FakeWorkerGroup;
using testing::FakeWorkerGroupOptions;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

struct Point {
  std::string name;
  double value;
  int64_t step;
  int64_t epoch;
};

// The job's record, as the trainer reports into it.
class Record final : public TrainerReporter {
 public:
  void Log(const std::string& line) override { lines.push_back(line); }
  void Progress(const v1::JobProgress& p) override { progress.push_back(p); }
  void Metric(const std::string& name, double value, int64_t step, int64_t epoch) override {
    points.push_back({name, value, step, epoch});
  }
  void Checkpoint(const std::string& l, const std::string& b) override {
    last = l;
    best = b;
  }
  void KeepFile(const v1::JobFile& file, const std::vector<std::string>& dropped) override {
    kept.push_back(file);
    for (const std::string& d : dropped) this->dropped.push_back(d);
  }
  void Predictions(const std::string& path) override { predictions = path; }

  std::vector<Point> Named(const std::string& name) const {
    std::vector<Point> out;
    for (const Point& p : points) {
      if (p.name == name) out.push_back(p);
    }
    return out;
  }
  int Lines(const std::string& part) const {
    int n = 0;
    for (const std::string& line : lines) n += absl::StrContains(line, part) ? 1 : 0;
    return n;
  }
  std::string Line(const std::string& part) const {
    for (const std::string& line : lines) {
      if (absl::StrContains(line, part)) return line;
    }
    return "";
  }

  std::vector<std::string> lines;
  std::vector<v1::JobProgress> progress;
  std::vector<Point> points;
  std::string last, best, predictions;
  std::vector<v1::JobFile> kept;
  std::vector<std::string> dropped;
};

// A clock that moves only when the test (or a call hook) says so.
class ManualClock {
 public:
  Clock clock() {
    return [this] { return now_; };
  }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
};

// 64 training samples over 2 ranks in batches of 8: 4 batches per rank per epoch.
v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_name("loops");
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_data()->set_eval_batch_size(8);
  spec.mutable_trainer()->set_num_nodes(2);
  spec.mutable_trainer()->set_max_epochs(3);
  spec.mutable_trainer()->set_batches_per_call(1);
  spec.mutable_trainer()->set_log_every_n_steps(2);
  spec.mutable_optimizer()->set_lr(0.1);
  spec.set_seed_everything(7);
  return spec;
}

class TrainerTest : public ::testing::Test {
 protected:
  // A run of `spec` on two fake workers sharing `store_`. The group stays readable through
  // group() after Run.
  std::unique_ptr<Trainer> Make(v1::JobSpec spec, FakeWorkerGroupOptions fake = {}) {
    EXPECT_TRUE(NormalizeJobSpec(&spec).ok());
    fake.store = &store_;
    if (!fake.before_call) {
      fake.before_call = [this](const FakeCall& call) {
        if (call.what == "training_step") clock_.Advance(absl::Seconds(1));
        return absl::OkStatus();
      };
    }
    auto group = std::make_unique<FakeWorkerGroup>(std::move(fake));
    group_ = group.get();
    TrainerOptions options;
    options.job_id = "job-1";
    options.spec = std::move(spec);
    options.output_dir = dir_;
    options.files = files_;
    options.clock = clock_.clock();
    options.submitted = clock_.clock()() - absl::Seconds(2);
    options.draining_workers = draining_;
    return std::make_unique<Trainer>(std::move(options), &record_, std::move(group));
  }

  // Every rank's training batches, epoch by epoch, as DistributedSampler deals them.
  static std::vector<testing::TrainedBatch> Expected(const v1::JobSpec& spec, int epochs) {
    std::vector<testing::TrainedBatch> out;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      std::vector<std::vector<std::vector<int64_t>>> ranks;
      for (int r = 0; r < 2; ++r) {
        ranks.push_back(Batches(TrainShard(64, 2, r, true, spec.seed_everything(), epoch),
                                spec.data().batch_size()));
      }
      for (size_t b = 0; b < ranks[0].size(); ++b) {
        for (int r = 0; r < 2; ++r) out.push_back({epoch, r, ranks[r][b]});
      }
    }
    return out;
  }

  FakeWorkerGroup& group() { return *group_; }

  ManualClock clock_;
  Record record_;
  FakeCheckpointStore store_;
  std::vector<v1::JobFile> files_;
  std::function<std::vector<std::string>()> draining_;
  std::string dir_ = absl::StrCat(::testing::TempDir(), "/trainer-test-", getpid());
  FakeWorkerGroup* group_ = nullptr;
};

// Every rank's val_loss at the k-th validation of the run is losses[k].
FakeWorkerGroupOptions ValidationLosses(std::vector<double> losses) {
  FakeWorkerGroupOptions fake;
  fake.validation_metrics = [losses = std::move(losses)](
                                int validation, int rank) -> std::map<std::string, double> {
    return {{"loss", losses[validation]}};
  };
  return fake;
}

bool SameBatches(const std::vector<testing::TrainedBatch>& a,
                 const std::vector<testing::TrainedBatch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].epoch != b[i].epoch || a[i].rank != b[i].rank || a[i].indices != b[i].indices) {
      return false;
    }
  }
  return true;
}

TEST_F(TrainerTest, Fit_ThreeEpochs_EveryShardOnceAStepPerBatchAndValidationEachEpoch) {
  auto trainer = Make(Spec());
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().global_step(), 12);
  EXPECT_TRUE(SameBatches(group().trained(), Expected(trainer->spec(), 3)));
  EXPECT_EQ(group().count("validation_step"), 3);
  EXPECT_EQ(group().count("test_step"), 1);
  // No monitor: last.ckpt at each validation and at the end of fit.
  EXPECT_EQ(group().count("save_checkpoint"), 4);
  EXPECT_THAT(store_.names(), ElementsAre("last.ckpt"));
  EXPECT_EQ(record_.last, "job:job-1/last.ckpt");
  EXPECT_EQ(record_.Lines("epoch 2 done: step 12"), 1);
  EXPECT_EQ(record_.Lines("validation at epoch 1 step 8: val_acc="), 1);
  EXPECT_EQ(record_.Lines("test: test_acc="), 1);
  EXPECT_EQ(record_.Lines("group formed: worker 'w0' (rank 0), worker 'w1' (rank 1); 64 training "
                          "samples, 4 batches per rank per epoch, 12 optimizer steps"),
            1);
  const v1::JobProgress& done = record_.progress.back();
  EXPECT_EQ(done.phase(), "done");
  EXPECT_EQ(done.global_step(), 12);
  EXPECT_EQ(done.total_steps(), 12);
  EXPECT_EQ(done.eta_seconds(), 0);
  EXPECT_EQ(done.collective_plane(), "fake");
  EXPECT_TRUE(trainer->lost_workers().empty());
}

TEST_F(TrainerTest, Metrics_EveryNStepsAndEpochEnds_WithTheLearningRateAndTestAtTheEnd) {
  auto trainer = Make(Spec());
  ASSERT_TRUE(trainer->Run().ok());
  // log_every_n_steps 2: steps 2, 4 (also an epoch end), 6, 8, 10, 12.
  std::vector<int64_t> steps;
  for (const Point& p : record_.Named("train_loss")) steps.push_back(p.step);
  EXPECT_THAT(steps, ElementsAre(2, 4, 6, 8, 10, 12));
  const std::vector<Point> lr = record_.Named("lr-SGD");
  ASSERT_EQ(lr.size(), 6u);
  EXPECT_DOUBLE_EQ(lr[0].value, 0.1);
  EXPECT_EQ(record_.Named("val_loss").size(), 3u);
  ASSERT_EQ(record_.Named("test_acc").size(), 1u);
  EXPECT_EQ(record_.Named("test_acc")[0].step, 12);
  // The loss the record shows is the mean over the last call's batches on both ranks.
  EXPECT_GT(record_.Named("train_loss")[0].value, record_.Named("train_loss").back().value);
}

TEST_F(TrainerTest, Progress_InjectedClock_SamplesPerSecondEtaAndPhasesExact) {
  auto trainer = Make(Spec());
  ASSERT_TRUE(trainer->Run().ok());
  // One second per training call of one batch per rank (16 samples).
  bool seen_half = false;
  for (const v1::JobProgress& p : record_.progress) {
    if (p.phase() == "train" && p.global_step() == 6 && p.batch_in_epoch() == 2) {
      seen_half = true;
      EXPECT_DOUBLE_EQ(p.samples_per_second(), 16);
      EXPECT_DOUBLE_EQ(p.eta_seconds(), 6);
    }
  }
  EXPECT_TRUE(seen_half);
  const v1::JobProgress& done = record_.progress.back();
  EXPECT_DOUBLE_EQ(done.phase_seconds().at("train"), 12);
  EXPECT_DOUBLE_EQ(done.phase_seconds().at("placement"), 2);
  EXPECT_DOUBLE_EQ(done.phase_seconds().at("first_step"), 2);
  EXPECT_EQ(record_.Lines("first training step starts 2.00 s after submit"), 1);
  EXPECT_THAT(record_.Line("time by phase: "), HasSubstr("train 12.0 s"));
  EXPECT_THAT(record_.Line("time by phase: "), HasSubstr("14.0 s since submit"));
  // The fake's ranks spend 0.01 s a batch; rank 1 waits 0.001 s of it.
  EXPECT_THAT(record_.Line("time by rank: "),
              HasSubstr("rank 1 0.12 s in steps, 0.01 s (10.0%) of it waiting for gradients"));
  EXPECT_THAT(record_.Line("time by rank: "),
              HasSubstr("in 12 training calls (batches per call: 1)"));
}

TEST_F(TrainerTest, ValidationInterval_FractionAndBatchCount_ValidatesWhereLightningDoes) {
  v1::JobSpec half = Spec();
  half.mutable_trainer()->set_val_check_interval(0.5);
  auto trainer = Make(half);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 6);
  EXPECT_EQ(record_.Lines("validation at epoch 0 step 2:"), 1);
  EXPECT_EQ(record_.Lines("validation at epoch 0 step 4:"), 1);

  // Above 1 it counts batches within each epoch: after batch 3 of 4, every epoch.
  record_ = Record();
  v1::JobSpec every3 = Spec();
  every3.mutable_trainer()->set_val_check_interval(3);
  trainer = Make(every3);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 3);
  EXPECT_EQ(record_.Lines("validation at epoch 0 step 3:"), 1);
  EXPECT_EQ(record_.Lines("validation at epoch 2 step 11:"), 1);
}

TEST_F(TrainerTest, Accumulation_WindowsAcrossCallsClosedAtEpochEnd) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_accumulate_grad_batches(3);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok());
  // 4 batches an epoch: a window of 3, then the epoch's last batch alone.
  EXPECT_EQ(group().global_step(), 6);
  EXPECT_EQ(record_.Lines("4 batches per rank per epoch, 6 optimizer steps"), 1);
}

TEST_F(TrainerTest, MaxSteps_MidEpoch_StopsAtExactlyThatStep) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(0);
  spec.mutable_trainer()->set_max_steps(6);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().global_step(), 6);
  EXPECT_EQ(group().trained().size(), 12u);  // 6 batches on each of 2 ranks
  EXPECT_EQ(record_.progress.back().total_steps(), 6);
  EXPECT_EQ(record_.Lines("epoch 1 done: step 6"), 1);
}

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

// The job log says what it trains with, defaults included.
TEST_F(TrainerTest, JobLog_SaysTheOptimizerItTrainsWith) {
  v1::JobSpec spec = Spec();
  spec.mutable_optimizer()->set_name("adamw");
  spec.mutable_optimizer()->set_lr(0.003);
  spec.mutable_optimizer()->set_beta1(0.9);
  spec.mutable_optimizer()->set_beta2(0.95);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(record_.Lines("optimizer: adamw, lr 0.003, betas (0.9, 0.95)"), 1)
      << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(record_.Lines("configure_optimizers is not read"), 1);
}

// A step's scalars are logged under their stage's prefix, once: "loss" from validation is
// val_loss, and a model's own "val_acc" stays val_acc (as Lightning logs it), not val_val_acc.
TEST_F(TrainerTest, StageMetricNames_PrefixedOnce) {
  v1::JobSpec spec = Spec();
  FakeWorkerGroupOptions fake;
  fake.validation_metrics = [](int, int) -> std::map<std::string, double> {
    return {{"loss", 0.5}, {"val_acc", 0.75}};
  };
  auto trainer = Make(spec, fake);
  ASSERT_TRUE(trainer->Run().ok());
  ASSERT_FALSE(record_.Named("val_acc").empty());
  EXPECT_DOUBLE_EQ(record_.Named("val_acc").back().value, 0.75);
  EXPECT_DOUBLE_EQ(record_.Named("val_loss").back().value, 0.5);
  EXPECT_TRUE(record_.Named("val_val_acc").empty());
  EXPECT_EQ(StageMetricName("test_", "acc"), "test_acc");
  EXPECT_EQ(StageMetricName("test_", "test_acc"), "test_acc");
  EXPECT_EQ(StageMetricName("train_", "train_acc"), "train_acc");
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

TEST_F(TrainerTest, ResumeMidEpoch_AfterAFailure_BitIdenticalToAnUninterruptedRun) {
  v1::JobSpec spec = Spec();
  spec.mutable_checkpoint()->set_every_n_steps(3);
  auto whole = Make(spec);
  ASSERT_TRUE(whole->Run().ok());
  const double uninterrupted = group().weight();
  const std::vector<testing::TrainedBatch> all = group().trained();

  // The same job fails before its 8th training call (after the step-6 checkpoint)...
  FakeCheckpointStore fresh;
  store_ = fresh;
  FakeWorkerGroupOptions failing;
  failing.before_call = [](const FakeCall& call) {
    return call.what == "training_step" && call.index == 7
               ? absl::AbortedError("rank 1 died (test)")
               : absl::OkStatus();
  };
  auto first = Make(spec, failing);
  const absl::Status failed = first->Run();
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failed.message(), HasSubstr("training_step failed on worker 'w0'"));
  EXPECT_EQ(record_.last, "job:job-1/last.ckpt");
  const std::vector<testing::TrainedBatch> before = group().trained();

  // ...and resumes from its last checkpoint: epoch 1, batch 2.
  spec.set_ckpt_path("job:job-1/last.ckpt");
  auto second = Make(spec);
  ASSERT_TRUE(second->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(record_.Lines("resumed from job:job-1/last.ckpt at step 6 (epoch 1, batch 2)"), 1);
  EXPECT_EQ(group().weight(), uninterrupted);  // exactly: the same sums in the same order
  EXPECT_EQ(group().global_step(), 12);
  // The resumed run trained exactly what the uninterrupted one did after step 6.
  const std::vector<testing::TrainedBatch> tail(all.begin() + 12, all.end());
  EXPECT_TRUE(SameBatches(group().trained(), tail));
  EXPECT_EQ(before.size(), 14u);  // 7 calls of one batch on each rank
}

TEST_F(TrainerTest, EveryNSteps_CallsSizedByTime_SavedAtExactlyEachMultiple) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_max_epochs(1);
  spec.mutable_trainer()->set_batches_per_call(0);  // sized by time: 16, then ~4 a call
  spec.mutable_checkpoint()->set_every_n_steps(5);
  FakeWorkerGroupOptions fake;
  fake.splits = {{"train", 512}, {"val", 16}, {"test", 16}};  // 32 batches per rank
  auto trainer = Make(spec, fake);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  std::vector<int64_t> steps;
  for (const v1::JobFile& f : record_.kept) steps.push_back(f.step());
  // Every 5 steps, then the epoch's validation and the end of fit at step 32.
  EXPECT_THAT(steps, ElementsAre(5, 10, 15, 20, 25, 30, 32, 32));
  EXPECT_EQ(group().global_step(), 32);
}

TEST_F(TrainerTest, ResumeAtTheEnd_NothingToTrain_LastCheckpointKeepsItsEpochAndStep) {
  auto whole = Make(Spec());
  ASSERT_TRUE(whole->Run().ok());
  ASSERT_EQ(store_.Find("last.ckpt")->epoch, 2);
  v1::JobSpec again = Spec();
  again.set_ckpt_path("job:job-1/last.ckpt");
  auto resumed = Make(again);
  ASSERT_TRUE(resumed->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().count("training_step"), 0);
  EXPECT_EQ(store_.Find("last.ckpt")->epoch, 2);
  EXPECT_EQ(store_.Find("last.ckpt")->global_step, 12);
  // No step told the workers the run's length; the save itself does (a cosine schedule's T_max).
  EXPECT_EQ(store_.Find("last.ckpt")->total_steps, 12);
  EXPECT_EQ(record_.kept.back().epoch(), 2);
}

TEST_F(TrainerTest, WorkerLostMidCall_RunFailsNamingItAndItIsLost) {
  FakeWorkerGroupOptions fake;
  FakeWorkerGroup** group = &group_;
  fake.before_call = [group](const FakeCall& call) {
    // The registry's monitor marks the worker lost while the call is under way.
    if (call.what == "training_step" && call.index == 2) {
      (*group)->MarkLost("w1", "no heartbeat for 5.0 s");
    }
    return absl::OkStatus();
  };
  auto trainer = Make(Spec(), fake);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("training_step lost worker 'w1' (rank 1) (no heartbeat for 5.0 s)"));
  EXPECT_EQ(group_->global_step(), 2);
  EXPECT_THAT(trainer->lost_workers(), ElementsAre("w1"));
  EXPECT_THAT(trainer->unreachable_workers(), ElementsAre("w1"));
  EXPECT_THAT(record_.Line("time by phase: "), HasSubstr("train"));  // said for a failed run too
}

TEST_F(TrainerTest, Drain_StoppingWorker_CheckpointsThenLetsItGoAtAStepBoundary) {
  // Asked before every call at a step boundary; the worker is stopping after step 5.
  int asked = 0;
  draining_ = [&]() -> std::vector<std::string> {
    return ++asked > 5 ? std::vector<std::string>{"w1"} : std::vector<std::string>{};
  };
  auto trainer = Make(Spec());
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("worker(s) 'w1' stopped (drained); checkpointed at "
                                          "step 5"));
  EXPECT_EQ(group().global_step(), 5);
  EXPECT_THAT(trainer->drained_workers(), ElementsAre("w1"));
  EXPECT_THAT(trainer->lost_workers(), ElementsAre("w1"));
  EXPECT_EQ(record_.last, "job:job-1/last.ckpt");
  EXPECT_EQ(store_.Find("last.ckpt")->global_step, 5);
}

TEST_F(TrainerTest, Cancel_DuringACall_CancelledByRequest) {
  FakeWorkerGroupOptions fake;
  FakeWorkerGroup** group = &group_;
  fake.before_call = [group](const FakeCall& call) {
    if (call.what == "training_step" && call.index == 3) (*group)->Cancel();
    return absl::OkStatus();
  };
  auto trainer = Make(Spec(), fake);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(status.message(), "cancelled by request");
  EXPECT_EQ(group_->global_step(), 3);
}

TEST_F(TrainerTest, Predict_TestSplit_OneRowPerSampleColumnsWithOneValuePerSample) {
  std::filesystem::create_directories(dir_);
  v1::JobSpec spec = Spec();
  spec.set_stage("predict");
  spec.mutable_data()->set_limit_test_samples(13);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().count("training_step"), 0);
  EXPECT_EQ(record_.predictions, dir_ + "/predictions.csv");
  std::ifstream csv(record_.predictions);
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 14u);  // a header and 13 samples, in index order
  EXPECT_EQ(lines[0], "index,label,score");
  EXPECT_EQ(lines[8], "7,7,-0.7");
  EXPECT_EQ(record_.Lines("predictions for 13 samples written to"), 1);
}

TEST_F(TrainerTest, Validate_Stage_NoCheckpointsNoEarlyStop_TestStageWithoutSplitFails) {
  v1::JobSpec spec = Spec();
  spec.set_stage("validate");
  spec.mutable_checkpoint()->set_monitor("val_loss");
  spec.mutable_early_stopping()->set_monitor("val_loss");
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 1);
  EXPECT_EQ(group().count("save_checkpoint"), 0);
  EXPECT_EQ(group().count("reduce_boolean_decision"), 0);
  EXPECT_EQ(record_.Named("val_loss").size(), 1u);

  v1::JobSpec test = Spec();
  test.set_stage("test");
  FakeWorkerGroupOptions no_test;
  no_test.splits = {{"train", 64}, {"val", 16}};
  trainer = Make(test, no_test);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "data: the dataset has no test split");
}

// limit_val_batches: 0 turns validation off, as in Lightning; unset validates everything; a
// positive value caps the batches per rank.
TEST_F(TrainerTest, LimitValBatches_ZeroTurnsValidationOff_UnsetIsAll) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_limit_val_batches(0);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().global_step(), 12);
  EXPECT_EQ(group().count("validation_step"), 0);
  EXPECT_EQ(group().count("test_step"), 1);
  EXPECT_EQ(record_.Lines("validation is off (trainer.limit_val_batches: 0)"), 1);
  EXPECT_TRUE(record_.Named("val_loss").empty());

  v1::JobSpec validate = Spec();
  validate.set_stage("validate");
  validate.mutable_trainer()->set_limit_val_batches(0);
  trainer = Make(validate);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("turns validation off"));
}

// check_val_every_n_epoch: 2 over 3 epochs validates after the second only, as Lightning's
// ((epoch + 1) % 2 == 0), and with val_check_interval 0.5 twice in it.
TEST_F(TrainerTest, CheckValEveryNEpoch_ValidatesOnlyThoseEpochs) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_check_val_every_n_epoch(2);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().global_step(), 12);
  EXPECT_EQ(group().count("validation_step"), 1);
  ASSERT_EQ(record_.Named("val_loss").size(), 1u);
  EXPECT_EQ(record_.Named("val_loss").front().epoch, 1);

  spec.mutable_trainer()->set_val_check_interval(0.5);
  trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok());
  EXPECT_EQ(group().count("validation_step"), 2);
}

TEST_F(TrainerTest, Setup_NoTrainSplit_FitRefusedNamingTheData) {
  FakeWorkerGroupOptions fake;
  fake.splits = {{"val", 16}};
  auto trainer = Make(Spec(), fake);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("fit needs a train split"));
  EXPECT_THAT(record_.lines, ::testing::Contains(HasSubstr("time by phase: placement 2.0 s")));
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
  FakeWorkerGroupOptions fake;
  // Epoch accuracy 0.5, 0.8, 0.6: rank 1's batches weigh as much as rank 0's.
  const std::vector<double> acc = {0.5, 0.8, 0.6};
  fake.training_logged = [&](int64_t epoch, int64_t batch,
                             int rank) -> std::map<std::string, LoggedValue> {
    const double value = acc[epoch] + (rank == 0 ? -0.1 : 0.1);
    return {{"train_acc", LoggedValue{.value = value,
                                      .local_value = value,
                                      .on_step = true,
                                      .on_epoch = true,
                                      .weight = 8}}};
  };
  auto trainer = Make(spec, fake);
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
  FakeWorkerGroupOptions fake;
  // The epoch loss falls, then stalls from epoch 1 on: epochs 2 and 3 do not improve.
  const std::vector<double> loss = {1.0, 0.5, 0.6, 0.55, 0.4, 0.3};
  fake.training_logged = [&](int64_t epoch, int64_t batch,
                             int rank) -> std::map<std::string, LoggedValue> {
    return {{"train_loss", LoggedValue{.value = loss[epoch],
                                       .local_value = loss[epoch],
                                       .on_step = true,
                                       .on_epoch = true,
                                       .weight = 8}}};
  };
  auto trainer = Make(spec, fake);
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

}  // namespace
}  // namespace dtrain

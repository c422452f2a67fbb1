// The trainer's loops, driven in-process against FakeWorkerGroup with a clock the test advances
// (trainer_fixture.h): epochs and steps, validation intervals, accumulation, max_steps, resume
// mid-epoch (bit-identical to an uninterrupted run), a worker lost mid-call, drain, cancel,
// predict, and what the loggers report (checkpoints and early stopping: trainer_callbacks_test). No
// processes, no gRPC, no sleeps: the real workers run the same loops in jobs_e2e_test and its
// neighbours.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/distributed_sampler.h"
#include "common/job_spec.h"
#include "coordinator/jobs/metric_names.h"
#include "coordinator/jobs/testing/fake_worker_group.h"
#include "coordinator/jobs/trainer.h"
#include "tests/trainer_fixture.h"

namespace dtrain {
namespace trainer_test {

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

TEST_F(TrainerTest, TrainingRate_LeavesOutValidationBetweenCalls_JobPaceKeepsIt) {
  // 1 s a training call (16 samples), 5 s a validation call: the job's pace counts the
  // validations, the training rate does not.
  FakeWorkerGroupOptions fake;
  fake.before_call = [this](const FakeCall& call) {
    if (call.what == "training_step") clock_.Advance(absl::Seconds(1));
    if (call.what == "validation_step") clock_.Advance(absl::Seconds(5));
    return absl::OkStatus();
  };
  auto trainer = Make(Spec(), fake);
  ASSERT_TRUE(trainer->Run().ok());
  const v1::JobProgress& done = record_.progress.back();
  EXPECT_DOUBLE_EQ(done.train_samples_per_second(), 16);
  EXPECT_GT(done.phase_seconds().at("validation"), 0);
  EXPECT_LT(done.samples_per_second(),
            16 * 12 / (12 + done.phase_seconds().at("validation")) + 1e-9);
  EXPECT_THAT(record_.Line("trained at "), HasSubstr("trained at 16.0 samples/s over 12.0 s"));
  EXPECT_THAT(record_.Line("epoch 1 done"), HasSubstr("training at 16 samples/s"));
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
  // A call's points reach the record together (one store transaction): the loss and the rate
  // of each logged step in the same batch: on average at least two points a batch.
  for (const Point& loss : record_.Named("train_loss")) {
    const auto same =
        std::find_if(lr.begin(), lr.end(), [&](const Point& p) { return p.step == loss.step; });
    ASSERT_NE(same, lr.end()) << "step " << loss.step;
    EXPECT_EQ(same->batch, loss.batch) << "step " << loss.step;
  }
  EXPECT_LE(2 * record_.metric_batches, static_cast<int>(record_.points.size()));
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
  // And the time each rank's step thread waited for its core, as the fake reports it: rank 1's
  // 10% is over the warning's share, rank 0's nothing is not.
  EXPECT_THAT(record_.Line("time by rank: "),
              HasSubstr("rank 0 0.12 s in steps, 0.00 s (0.0%) of it waiting for gradients, "
                        "0.00 s (0.0%) for its core"));
  EXPECT_THAT(record_.Line("time by rank: "),
              HasSubstr("(10.0%) of it waiting for gradients, 0.01 s (10.0%) for its core"));
  EXPECT_EQ(record_.Lines("shared cores: rank 1's step thread waited 10% of its step time"), 1);
  // And where a batch's 10 ms went on each rank, as the fake reports its phases.
  EXPECT_THAT(record_.Line("time per batch by rank: "),
              HasSubstr("rank 0 10.000 ms: data 1.000, forward 3.000, backward 3.000, averaging "
                        "gradients 1.000, optimizer 1.000, other 1.000; rank 1 10.000 ms: data "
                        "1.000, forward 3.000, backward 2.000, averaging gradients 2.000, "
                        "optimizer 1.000, other 1.000"));
}

TEST_F(TrainerTest, AutoSizedCalls_TakeAShortRestOfTheEpochAlong) {
  // 20 batches per rank and epoch, each 10 ms on the fake's clock: 25 make the 0.25 s target.
  v1::JobSpec spec = Spec();
  spec.mutable_data()->mutable_synthetic()->set_train_size(320);
  spec.mutable_trainer()->set_batches_per_call(0);
  FakeWorkerGroupOptions fake;
  fake.splits["train"] = 320;
  fake.before_call = [this](const FakeCall& call) {
    if (call.what == "training_step") clock_.Advance(call.batches * absl::Milliseconds(10));
    return absl::OkStatus();
  };
  auto trainer = Make(spec, fake);
  ASSERT_TRUE(trainer->Run().ok());
  // The first call's 16 batches would leave 4, under half a call, so it takes all 20; and so
  // does every later one (25 wanted, 20 left): one call an epoch, where 16 and 4 were two.
  EXPECT_THAT(record_.Line("time by rank: "),
              HasSubstr("in 3 training calls (batches per call: auto, up to 20)"));
  EXPECT_EQ(record_.progress.back().global_step(), 60);
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

// Mid-epoch, the next call goes out before the last one answers. The fake fails any call that
// comes while a training call is unfinished, so this run also shows that none of validation, a
// checkpoint's step, max_steps or an epoch's end is crossed; and the run is the one a call at a
// time gives, batch for batch and bit for bit.
TEST_F(TrainerTest, PipelinedCalls_NothingComesBetween_SameRunAsOneCallAtATime) {
  struct Run {
    double weight = 0;
    int64_t step = 0;
    std::vector<testing::TrainedBatch> trained;
    std::vector<std::pair<std::string, int64_t>> calls;  // what, first batch
    std::vector<int64_t> saved;
    int pipelined = 0;
    std::string calls_line;
  };
  auto run = [this](bool pipelined) {
    v1::JobSpec spec = Spec();
    // 16 batches per rank an epoch in windows of 3 (6 steps), validation at its middle and end,
    // a checkpoint every 4 steps, and max_steps in the second epoch.
    spec.mutable_trainer()->set_max_epochs(3);
    spec.mutable_trainer()->set_max_steps(10);
    spec.mutable_trainer()->set_accumulate_grad_batches(3);
    spec.mutable_trainer()->set_val_check_interval(0.5);
    spec.mutable_trainer()->set_batches_per_call(2);
    spec.mutable_trainer()->set_pipelined_calls(pipelined);
    spec.mutable_checkpoint()->set_every_n_steps(4);
    FakeWorkerGroupOptions fake;
    fake.splits = {{"train", 256}, {"val", 16}, {"test", 16}};
    const absl::Status status = RunAfresh(spec, fake);
    EXPECT_TRUE(status.ok()) << status;
    Run out;
    out.weight = group().weight();
    out.step = group().global_step();
    out.trained = group().trained();
    for (const FakeCall& call : group().calls()) {
      out.calls.emplace_back(call.what, call.what == "training_step" ? call.first : 0);
      out.pipelined += call.pipelined ? 1 : 0;
    }
    for (const v1::JobFile& f : record_.kept) out.saved.push_back(f.step());
    out.calls_line = record_.Line("training calls");
    EXPECT_EQ(group().abandoned(), 0);
    return out;
  };
  const Run one_at_a_time = run(false);
  const Run pipelined = run(true);
  EXPECT_EQ(one_at_a_time.pipelined, 0);
  // Per epoch: calls from batches 0, 2, 4, 6 up to validation, then 8, ..., 14; the first of each
  // half is sent alone, and after step 4's and step 8's checkpoints the next is too.
  EXPECT_GE(pipelined.pipelined, 6);
  EXPECT_THAT(pipelined.calls_line,
              HasSubstr(absl::StrCat(", ", pipelined.pipelined, " pipelined")));
  EXPECT_EQ(pipelined.step, 10);
  EXPECT_EQ(pipelined.weight, one_at_a_time.weight);
  EXPECT_EQ(pipelined.calls, one_at_a_time.calls);
  EXPECT_EQ(pipelined.saved, one_at_a_time.saved);
  ASSERT_EQ(pipelined.trained.size(), one_at_a_time.trained.size());
  for (size_t i = 0; i < pipelined.trained.size(); ++i) {
    EXPECT_EQ(pipelined.trained[i].epoch, one_at_a_time.trained[i].epoch) << i;
    EXPECT_EQ(pipelined.trained[i].indices, one_at_a_time.trained[i].indices) << i;
  }
}

// A call that fails with the next one in flight: that one is taken back, never run.
TEST_F(TrainerTest, PipelinedCalls_ACallFails_TheOneAfterItIsTakenBack) {
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_batches_per_call(1);
  FakeWorkerGroupOptions fake;
  fake.before_call = [](const FakeCall& call) {
    return call.what == "training_step" && call.index == 2
               ? absl::InvalidArgumentError("batch 2 is broken")
               : absl::OkStatus();
  };
  auto trainer = Make(spec, fake);
  const absl::Status status = trainer->Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(group().count("training_step"), 3);
  EXPECT_EQ(group().abandoned(), 1) << "the call sent after batch 2's";
  EXPECT_EQ(group().global_step(), 2);
  EXPECT_EQ(group().trained().size(), 4u);  // batches 0 and 1 on both ranks
}

// Workers that deal a call's batches themselves get the sampler's settings; with
// trainer.sampled_calls: false, or beside a worker that deals otherwise, every worker gets the
// indices listed, and the job log says why. The run is the same either way, batch for batch.
TEST_F(TrainerTest, SampledCalls_DealtOrListed_SameRun_TheLogSaysWhyItLists) {
  struct Run {
    double weight = 0;
    std::vector<testing::TrainedBatch> trained;
    int listed = 0, calls = 0;
    std::string why;
  };
  auto run = [&](bool deals, bool sampled_calls, std::vector<std::string> others) {
    v1::JobSpec spec = Spec();
    spec.mutable_trainer()->set_sampled_calls(sampled_calls);
    FakeWorkerGroupOptions fake;
    fake.sampled_work = deals;
    fake.other_deals = std::move(others);
    const absl::Status status = RunAfresh(spec, fake);
    EXPECT_TRUE(status.ok()) << status;
    Run out;
    out.weight = group().weight();
    out.trained = group().trained();
    for (const FakeCall& call : group().calls()) {
      if (call.what != "training_step") continue;
      ++out.calls;
      out.listed += call.listed ? 1 : 0;
    }
    out.why = record_.Line("training calls list every rank's sample indices");
    return out;
  };
  const Run dealt = run(true, true, {});
  EXPECT_EQ(dealt.listed, 0);
  EXPECT_GT(dealt.calls, 0);
  EXPECT_EQ(dealt.why, "");
  const Run asked = run(true, false, {});
  EXPECT_EQ(asked.listed, asked.calls);
  EXPECT_THAT(asked.why, HasSubstr(": trainer.sampled_calls is false")) << asked.why;
  const Run older = run(false, true, {"worker 'w1' deals no batches (an older build)"});
  EXPECT_EQ(older.listed, older.calls);
  EXPECT_EQ(older.why,
            "training calls list every rank's sample indices: worker 'w1' deals no batches (an "
            "older build); this coordinator deals by 'fisher-yates-mt19937_64/1': run workers of "
            "its version for calls that name their batches by sampler");
  // A group that never deals (the fake as other tests use it) is listed without a word.
  const Run plain = run(false, true, {});
  EXPECT_EQ(plain.listed, plain.calls);
  EXPECT_EQ(plain.why, "");
  for (const Run* other : {&asked, &older, &plain}) {
    EXPECT_EQ(other->weight, dealt.weight);
    EXPECT_TRUE(SameBatches(other->trained, dealt.trained));
  }
  EXPECT_TRUE(SameBatches(dealt.trained, Expected(Spec(), 3)));
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
  // Asked at every step boundary a call may start from (sent alone, or pipelined behind the
  // call before it); the worker is stopping from the sixth question on, which comes before
  // batch 1 of epoch 1 is sent, so the call in flight (batch 0, step 5) ends first.
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

// limit_test_batches: 0 turns the test after fit off (stage test then fails); a positive value
// caps test and predict batches per rank, as limit_predict_batches does predict's.
TEST_F(TrainerTest, LimitTestAndPredictBatches_ZeroTurnsTheTestOff_PositiveCaps) {
  std::filesystem::create_directories(dir_);
  v1::JobSpec spec = Spec();
  spec.mutable_trainer()->set_limit_test_batches(0);
  auto trainer = Make(spec);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  EXPECT_EQ(group().count("test_step"), 0);
  EXPECT_EQ(record_.Lines("the test is off (trainer.limit_test_batches: 0)"), 1);
  EXPECT_TRUE(record_.Named("test_acc").empty());

  v1::JobSpec test = Spec();
  test.set_stage("test");
  test.mutable_trainer()->set_limit_test_batches(0);
  trainer = Make(test);
  EXPECT_EQ(trainer->Run().code(), absl::StatusCode::kFailedPrecondition);

  v1::JobSpec predict = Spec();
  predict.set_stage("predict");
  predict.mutable_data()->set_eval_batch_size(3);
  predict.mutable_trainer()->set_limit_predict_batches(2);
  trainer = Make(predict);
  ASSERT_TRUE(trainer->Run().ok()) << absl::StrJoin(record_.lines, "\n");
  // 2 batches of 3 on each of the 2 ranks.
  EXPECT_EQ(record_.Lines("predictions for 12 samples written to"), 1);
  predict.mutable_trainer()->set_limit_predict_batches(0);
  trainer = Make(predict);
  EXPECT_EQ(trainer->Run().code(), absl::StatusCode::kFailedPrecondition);
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

}  // namespace trainer_test
}  // namespace dtrain

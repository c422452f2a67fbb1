// The worker daemon's strategies against each other, end to end: real dtrain-worker processes
// driven through the Worker gRPC service. ddp on two workers equals one worker with the whole
// batch, ddp_spawn's children equal ddp, dp equals single_device, gradient accumulation equals
// a bigger batch, a sharded checkpoint loads into another world size, and a dead peer is named
// to the survivor; the distributed ones over each collective backend (grpc, gloo, shm).
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "common/thread_schedstat.h"
#include "dtrain/v1/workers.grpc.pb.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"
#include "tests/worker_service_fixture.h"

namespace dtrain::testing {
namespace worker_service_strategies_test {

using ::testing::HasSubstr;

// 2 ranks with per-rank batch B for 20 steps end where 1 rank with batch 2B does.
TEST_P(WorkerServiceBackendTest, Ddp_TwoWorkersEqualOneWorkerWithTheWholeBatch) {
  auto a = StartWorker(), b = StartWorker(), single = StartWorker();
  ASSERT_TRUE(a && b && single);
  std::vector<WorkerProcess*> ranks = {a.get(), b.get()};
  std::vector<v1::SetupResponse> setups(2);
  std::vector<absl::Status> statuses(2);
  Parallel(2, [&](int i) {
    v1::SetupRequest request = Distributed("ddp-eq", "ddp", 2);
    // Small buckets, so that several all_reduces overlap with backward (on shm, which does not
    // overlap, they make one bucket).
    request.mutable_spec()->mutable_trainer()->set_bucket_cap_mb(1.0 / 16);  // 64 KiB
    statuses[i] = Setup(*ranks[i], request, &setups[i]);
  });
  ASSERT_TRUE(statuses[0].ok()) << statuses[0];
  ASSERT_TRUE(statuses[1].ok()) << statuses[1];
  // Which worker got which rank is the rendezvous' choice; map them back.
  if (setups[0].ranks(0).rank() == 1) std::swap(ranks[0], ranks[1]);
  ASSERT_TRUE(Setup(*single, MakeSetup("ddp-ref", "single_device", 1, address())).ok());

  constexpr int kSteps = 20, kB = 16;
  std::vector<v1::StepResponse> responses(2);
  for (int step = 0; step < kSteps; step += 5) {
    Parallel(2, [&](int r) {
      auto out = Train(*ranks[r], "ddp-eq", {Slice(step, r, 2, kB, 5)});
      statuses[r] = out.status();
      if (out.ok()) responses[r] = *std::move(out);
    });
    ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
    // Each rank's profile of the call: every phase took time, and together they fit in the
    // call's step time; the averaging holds the wait for the other rank's gradients.
    for (const v1::StepResponse& response : responses) {
      ASSERT_EQ(response.results_size(), 1);
      const v1::LocalResult& local = response.results(0);
      const v1::StepPhases& p = local.phases();
      EXPECT_GT(p.data_seconds(), 0);
      EXPECT_GT(p.forward_seconds(), 0);
      EXPECT_GT(p.backward_seconds(), 0);
      EXPECT_GT(p.averaging_seconds(), 0);
      EXPECT_GT(p.optimizer_seconds(), 0);
      EXPECT_GE(p.averaging_seconds(), local.gradient_wait_seconds());
      EXPECT_LE(p.data_seconds() + p.forward_seconds() + p.backward_seconds() +
                    p.averaging_seconds() + p.optimizer_seconds(),
                local.step_seconds());
      // The step thread's wait for its core, where the kernel keeps it (this thread's says):
      // a part of the step's time.
      if (ThisThreadSchedstat().ok()) {
        ASSERT_TRUE(local.has_core_wait_seconds());
        EXPECT_GE(local.core_wait_seconds(), 0);
        EXPECT_LE(local.core_wait_seconds(), local.step_seconds());
      }
    }
    // The single rank's batch s is both ranks' batches s together.
    v1::LocalWork whole;
    whole.set_first_batch_idx(step);
    for (int s = step; s < step + 5; ++s)
      *whole.add_index_batches() = Slice(s, 0, 1, 2 * kB).index_batches(0);
    ASSERT_TRUE(Train(*single, "ddp-ref", {whole}).ok());
  }
  const auto pa = Parameters(*ranks[0], "ddp-eq");
  const auto pb = Parameters(*ranks[1], "ddp-eq");
  const auto ps = Parameters(*single, "ddp-ref");
  EXPECT_EQ(MaxDiff(pa, pb), 0.0) << "ranks must hold identical parameters";
  EXPECT_LE(MaxDiff(pa, ps), 1e-5);
  // Training moved the parameters (the comparison is not between two untouched models).
  ASSERT_TRUE(Teardown(*single).ok());
  ASSERT_TRUE(Setup(*single, MakeSetup("ddp-fresh", "single_device", 1, address())).ok());
  EXPECT_GT(MaxDiff(Parameters(*single, "ddp-fresh"), ps), 1e-3);
}

// ddp's optimizer step split between the ranks (trainer.split_optimizer_step, on shm: each rank
// steps its share of the parameters and hands the others the new values) trains bitwise as the
// whole step on every rank does, with SGD (momentum, Nesterov, weight decay) and with AdamW;
// the checkpoints of both hold the same optimizer state (every tensor and the step),
// read by Python's torch, and each parameter in a storage of its own. Elsewhere the step is
// never split.
TEST_P(WorkerServiceBackendTest, Ddp_SplitOptimizerStepEqualsTheWholeStep_BitForBit) {
  const bool shm = GetParam() == "shm";
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(StartWorker());
    ASSERT_NE(workers.back(), nullptr);
  }
  const std::string dir = TestTempPath("split-step-" + GetParam());
  std::filesystem::remove_all(dir);
  for (const std::string optimizer : {"sgd", "adamw"}) {
    SCOPED_TRACE(optimizer);
    // Group 0 splits (the default), group 1 does not; ranks[g][r].
    std::vector<std::vector<WorkerProcess*>> ranks = {{workers[0].get(), workers[1].get()},
                                                      {workers[2].get(), workers[3].get()}};
    const std::vector<std::string> jobs = {"split-" + optimizer, "whole-" + optimizer};
    for (int g = 0; g < 2; ++g) {
      v1::SetupRequest request = Distributed(jobs[g], "ddp", 2);
      v1::JobSpec& spec = *request.mutable_spec();
      spec.mutable_optimizer()->set_name(optimizer);
      spec.mutable_optimizer()->set_weight_decay(1e-3);
      if (optimizer == "sgd") {
        spec.mutable_optimizer()->set_nesterov(true);
      } else {
        spec.mutable_optimizer()->set_lr(1e-3);
      }
      spec.mutable_checkpoint()->set_dirpath(absl::StrCat("worker:", dir, "/", jobs[g]));
      if (g == 1) spec.mutable_trainer()->set_split_optimizer_step(false);
      std::vector<v1::SetupResponse> setups(2);
      std::vector<absl::Status> statuses(2);
      Parallel(2, [&](int i) { statuses[i] = Setup(*ranks[g][i], request, &setups[i]); });
      ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
      if (setups[0].ranks(0).rank() == 1) std::swap(ranks[g][0], ranks[g][1]);
      // The job log's line says which step it takes: the MLP reads no .grad, so between a
      // call's steps the mean lands in each rank's own part only.
      EXPECT_EQ(absl::StrContains(setups[0].optimization(),
                                  "its step split between the 2 ranks, the mean between a call's "
                                  "steps in each rank's own part only"),
                shm && g == 0)
          << setups[0].optimization();
    }
    std::vector<absl::Status> statuses(4);
    // Every rank saves (rank 0 writes); the split job's state is gathered from both ranks.
    auto save_all = [&](const std::string& name) {
      Parallel(4, [&](int k) {
        v1::SaveCheckpointRequest save;
        save.set_job_id(jobs[k / 2]);
        save.set_name(name);
        v1::SaveCheckpointResponse saved;
        statuses[k] = Call(
            [&](auto* c) { return ranks[k / 2][k % 2]->stub().SaveCheckpoint(c, save, &saved); });
      });
    };
    // Before the first step: the optimizer's state is empty (a fresh one), as torch saves it.
    save_all("fresh.ckpt");
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    for (int step = 0; step < 12; step += 4) {
      Parallel(4, [&](int k) {
        statuses[k] =
            Train(*ranks[k / 2][k % 2], jobs[k / 2], {Slice(step, k % 2, 2, 16, 4)}).status();
      });
      for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    }
    const auto split = Parameters(*ranks[0][0], jobs[0]);
    EXPECT_EQ(MaxDiff(split, Parameters(*ranks[0][1], jobs[0])), 0.0);
    EXPECT_EQ(MaxDiff(split, Parameters(*ranks[1][0], jobs[1])), 0.0);
    EXPECT_EQ(MaxDiff(split, Parameters(*ranks[1][1], jobs[1])), 0.0);
    save_all("last.ckpt");
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    CommandResult python = RunShell(absl::StrCat(
        "/usr/bin/python3 -c 'import torch; a, b = (torch.load(\"", dir,
        "/\" + j + \"/last.ckpt\")"
        "[\"optimizer_states\"][0][\"state\"] for j in (\"",
        jobs[0], "\", \"", jobs[1],
        "\")); "
        "assert sorted(a) == sorted(b) == [0, 1, 2, 3], (sorted(a), sorted(b)); "
        "assert all(sorted(a[k]) == sorted(b[k]) for k in a), [(sorted(a[k]), sorted(b[k])) "
        "for k in a]; "
        "same = lambda x, y: torch.equal(x, y) if torch.is_tensor(x) else x == y; "
        "assert all(same(a[k][n], b[k][n]) for k in a for n in a[k]), [(k, n) for k in a "
        "for n in a[k] if not same(a[k][n], b[k][n])]; "
        "assert all(any(torch.is_tensor(v) and v.numel() > 1 and v.abs().max() > 0 "
        "for v in a[k].values()) for k in a); "
        // Each parameter in a storage of its own, though the split job's share a buffer.
        "w = torch.load(\"",
        dir, "/", jobs[0],
        "/last.ckpt\")[\"state_dict\"]; "
        "assert all(v.storage().size() == v.numel() for v in w.values()), "
        "[(k, v.storage().size()) for k, v in w.items()]; "
        "print(\"same state:\", sorted(a[0]))'"));
    EXPECT_EQ(python.exit_code, 0) << python.output;
    EXPECT_THAT(python.output,
                HasSubstr(optimizer == "sgd" ? "same state: ['momentum_buffer']"
                                             : "same state: ['exp_avg', 'exp_avg_sq', 'step']"));
    // A restore, a checkpoint before the next step (a resumed run that validates first), then
    // training on: the split job continues from the restored state, as the whole step does.
    auto load_all = [&](const std::string& name) {
      Parallel(4, [&](int k) {
        v1::LoadCheckpointRequest load;
        load.set_job_id(jobs[k / 2]);
        load.set_path(absl::StrCat(dir, "/", jobs[k / 2], "/", name));
        v1::LoadCheckpointResponse loaded;
        statuses[k] = Call(
            [&](auto* c) { return ranks[k / 2][k % 2]->stub().LoadCheckpoint(c, load, &loaded); });
      });
    };
    auto train_on = [&](int step) {
      Parallel(4, [&](int k) {
        statuses[k] =
            Train(*ranks[k / 2][k % 2], jobs[k / 2], {Slice(step, k % 2, 2, 16, 4)}).status();
      });
    };
    load_all("last.ckpt");
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << "last.ckpt: " << s;
    // A file refused right after (not a checkpoint) restores nothing: the state just restored,
    // which no part holds yet, stays for the next step.
    for (const std::string& job : jobs) {
      std::ofstream(absl::StrCat(dir, "/", job, "/refused.ckpt")) << "not a checkpoint";
    }
    load_all("refused.ckpt");
    for (const absl::Status& s : statuses) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    }
    save_all("again.ckpt");
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << "again.ckpt: " << s;
    train_on(12);
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(MaxDiff(Parameters(*ranks[0][0], jobs[0]), Parameters(*ranks[1][0], jobs[1])), 0.0)
        << "after a restore and a checkpoint, the split step went on from another state";
    // Back to the fresh checkpoint mid-run: its empty state restarts the optimizer (Adam's step
    // count at 0, no momentum), split or whole, and the split parts made since do not survive.
    load_all("fresh.ckpt");
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << "fresh.ckpt: " << s;
    train_on(16);
    for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    const auto restarted = Parameters(*ranks[0][0], jobs[0]);
    EXPECT_EQ(MaxDiff(restarted, Parameters(*ranks[1][0], jobs[1])), 0.0)
        << "after restoring a checkpoint saved before the first step, the split step kept the "
           "optimizer state of the steps since";
    EXPECT_EQ(MaxDiff(restarted, Parameters(*ranks[0][1], jobs[0])), 0.0);
    for (const auto& worker : workers) ASSERT_TRUE(Teardown(*worker).ok());
  }
}

// A model whose training_step reads .grad sees, in each batch after the first, the averaged
// gradients of the step before it: the same on both ranks and in the whole step's job, bitwise,
// even between the steps of one call, where a split step of a model that reads no gradients
// leaves each rank's averaged gradients only where it updated (LightningModule::ReadsGradients).
TEST_P(WorkerServiceBackendTest, Ddp_SplitStep_ModelThatReadsGradientsSeesTheAveragedOnes) {
  const std::string path = TestTempPath("reads-grad-" + GetParam() + ".pt");
  {
    torch::manual_seed(5);
    torch::jit::Module m("ReadsGrad");
    m.register_parameter("w", (torch::randn({10, 784}) * 0.01).requires_grad_(true), false);
    m.register_parameter("b", torch::zeros({10}).requires_grad_(true), false);
    m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    x, y = batch
    g = self.w.grad
    seen = torch.zeros([1]) if g is None else (g.abs().sum() * 1000.0).reshape([1])
    loss = torch.nll_loss(torch.log_softmax(torch.linear(x.flatten(1), self.w, self.b), 1), y)
    return {"loss": loss, "seen": seen}
)");
    m.save(path);
  }
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(StartWorker());
    ASSERT_NE(workers.back(), nullptr);
  }
  // Group 0 splits its step where it can (the default), group 1 does not; ranks[g][r].
  std::vector<std::vector<WorkerProcess*>> ranks = {{workers[0].get(), workers[1].get()},
                                                    {workers[2].get(), workers[3].get()}};
  const std::vector<std::string> jobs = {"reads-split", "reads-whole"};
  for (int g = 0; g < 2; ++g) {
    v1::SetupRequest request = Distributed(jobs[g], "ddp", 2);
    request.mutable_spec()->mutable_model()->set_torchscript(path);
    if (g == 1) request.mutable_spec()->mutable_trainer()->set_split_optimizer_step(false);
    std::vector<v1::SetupResponse> setups(2);
    std::vector<absl::Status> statuses(2);
    Parallel(2, [&](int i) { statuses[i] = Setup(*ranks[g][i], request, &setups[i]); });
    ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
    EXPECT_EQ(absl::StrContains(setups[0].optimization(),
                                "its step split between the 2 ranks, the mean on every rank at "
                                "every step"),
              GetParam() == "shm" && g == 0)
        << setups[0].optimization();
    if (setups[0].ranks(0).rank() == 1) std::swap(ranks[g][0], ranks[g][1]);
  }
  // Two calls of 4 batches each: 3 steps inside each call, and one at each call's end.
  std::vector<std::vector<double>> seen(4);
  for (int step = 0; step < 8; step += 4) {
    std::vector<absl::StatusOr<v1::StepResponse>> answers(4, absl::UnknownError("not run"));
    Parallel(4, [&](int k) {
      answers[k] = Train(*ranks[k / 2][k % 2], jobs[k / 2], {Slice(step, k % 2, 2, 16, 4)});
    });
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE(answers[k].ok()) << answers[k].status();
      for (const v1::BatchResult& batch : answers[k]->results(0).batches()) {
        seen[k].push_back(batch.scalars().at("seen"));
      }
    }
  }
  for (const std::vector<double>& rank : seen) ASSERT_EQ(rank.size(), 8u);
  // Before the first backward: no gradient (or the zeros of a bucket's fresh slot).
  EXPECT_EQ(seen[0][0], 0.0);
  for (size_t i = 1; i < seen[0].size(); ++i) {
    SCOPED_TRACE(absl::StrCat("batch ", i));
    EXPECT_GT(seen[0][i], 0.0);
    EXPECT_EQ(seen[0][i], seen[1][i]) << "the ranks saw different gradients";
    EXPECT_EQ(seen[0][i], seen[2][i]) << "the split step's differ from the whole step's";
    EXPECT_EQ(seen[2][i], seen[3][i]);
  }
}

// A ddp group of one has nothing to average: it trains bitwise as single_device does, and its
// steps spend no time on gradient communication (there is none to wait for).
TEST_F(WorkerServiceTest, Ddp_GroupOfOneEqualsSingleDeviceAndWaitsForNoGradients) {
  auto ddp = StartWorker(), single = StartWorker();
  ASSERT_TRUE(ddp && single);
  ASSERT_TRUE(Setup(*ddp, MakeSetup("ddp-one", "ddp", 1, address(), "shm")).ok());
  ASSERT_TRUE(Setup(*single, MakeSetup("one-ref", "single_device", 1, address())).ok());
  for (int step = 0; step < 10; step += 5) {
    auto a = Train(*ddp, "ddp-one", {Slice(step, 0, 1, 16, 5)});
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->results_size(), 1);
    EXPECT_EQ(a->results(0).batches_size(), 5);
    EXPECT_EQ(a->results(0).gradient_wait_seconds(), 0.0);
    auto b = Train(*single, "one-ref", {Slice(step, 0, 1, 16, 5)});
    ASSERT_TRUE(b.ok()) << b.status();
  }
  const auto trained = Parameters(*single, "one-ref");
  EXPECT_EQ(MaxDiff(Parameters(*ddp, "ddp-one"), trained), 0.0);
  ASSERT_TRUE(Teardown(*single).ok());
  ASSERT_TRUE(Setup(*single, MakeSetup("one-fresh", "single_device", 1, address())).ok());
  EXPECT_GT(MaxDiff(Parameters(*single, "one-fresh"), trained), 1e-3);
}

TEST_P(WorkerServiceBackendTest, DdpSpawn_ChildrenAreRanksInIndexOrderAndEqualDdp) {
  auto spawner = StartWorker({"--devices=2", "--name=spawner"});
  auto single = StartWorker();
  ASSERT_TRUE(spawner && single);
  v1::SetupResponse setup;
  v1::SetupRequest request = Distributed("spawn", "ddp_spawn", 2);
  ASSERT_TRUE(Setup(*spawner, request, &setup).ok());
  ASSERT_EQ(setup.ranks_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(setup.ranks(i).rank(), i);
    EXPECT_EQ(setup.ranks(i).local_rank(), i);
    EXPECT_EQ(setup.ranks(i).world_size(), 2);
    EXPECT_NE(setup.ranks(i).pid(), spawner->pid());
  }
  EXPECT_EQ(Health(*spawner).local_processes(), 2);
  ASSERT_TRUE(Setup(*single, MakeSetup("spawn-ref", "single_device", 1, address())).ok());
  for (int step = 0; step < 10; ++step) {
    auto out = Train(*spawner, "spawn", {Slice(step, 0, 2, 16), Slice(step, 1, 2, 16)});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->results_size(), 2);
    ASSERT_TRUE(Train(*single, "spawn-ref", {Slice(step, 0, 1, 32)}).ok());
  }
  EXPECT_LE(MaxDiff(Parameters(*spawner, "spawn"), Parameters(*single, "spawn-ref")), 1e-5);

  // Work for one rank only is refused: the worker hosts two.
  auto wrong = Train(*spawner, "spawn", {Slice(0, 0, 2, 16)});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("hosts 2 ranks"));

  // Teardown reaps both children.
  const pid_t child = setup.ranks(1).pid();
  ASSERT_TRUE(Teardown(*spawner).ok());
  EXPECT_TRUE(WaitFor([&] { return kill(child, 0) != 0; }, absl::Seconds(5)));
  EXPECT_EQ(Health(*spawner).state(), v1::HealthResponse::IDLE);
}

// dp splits each batch across the worker's devices and averages the replicas' losses: with
// equal halves, exactly single_device's mean loss and update.
TEST_F(WorkerServiceTest, Dp_TrainValidateTestPredict_EqualSingleDevice) {
  auto dp = StartWorker({"--devices=2"});
  auto single = StartWorker();
  ASSERT_TRUE(dp && single);
  ASSERT_TRUE(Setup(*dp, MakeSetup("dp", "dp", 1, address())).ok());
  ASSERT_TRUE(Setup(*single, MakeSetup("dp-ref", "single_device", 1, address())).ok());
  for (int step = 0; step < 5; ++step) {
    auto a = Train(*dp, "dp", {Slice(step, 0, 1, 32)});
    auto b = Train(*single, "dp-ref", {Slice(step, 0, 1, 32)});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_NEAR(a->results(0).batches(0).scalars().at("loss"),
                b->results(0).batches(0).scalars().at("loss"), 1e-5);
  }
  EXPECT_LE(MaxDiff(Parameters(*dp, "dp"), Parameters(*single, "dp-ref")), 1e-5);

  // Validation, test and predict on the trained models: dp's mean over its 2 replicas of 32
  // samples each equals single_device's mean over the 64; predict's rows come back gathered, in
  // order.
  v1::StepRequest eval;
  v1::IndexBatch* batch = eval.add_work()->add_index_batches();
  batch->set_split("val");
  for (int i = 0; i < 64; ++i) batch->add_indices(i);
  eval.set_return_outputs(true);
  auto run = [&](WorkerProcess& w, const std::string& job, const char* kind) {
    v1::StepRequest request = eval;
    request.set_job_id(job);
    v1::StepResponse response;
    absl::Status s = Call([&](auto* c) {
      if (std::string(kind) == "validation") return w.stub().ValidationStep(c, request, &response);
      if (std::string(kind) == "test") return w.stub().TestStep(c, request, &response);
      return w.stub().PredictStep(c, request, &response);
    });
    EXPECT_TRUE(s.ok()) << kind << ": " << s;
    return response;
  };
  for (const char* kind : {"validation", "test"}) {
    SCOPED_TRACE(kind);
    const v1::BatchResult a = run(*dp, "dp", kind).results(0).batches(0);
    const v1::BatchResult b = run(*single, "dp-ref", kind).results(0).batches(0);
    EXPECT_EQ(a.size(), 64);
    EXPECT_NEAR(a.scalars().at("loss"), b.scalars().at("loss"), 1e-5);
    EXPECT_NEAR(a.scalars().at("acc"), b.scalars().at("acc"), 1e-6);
    EXPECT_GT(b.scalars().at("acc"), 0.3) << "the models learned something (not a vacuous match)";
  }
  const v1::BatchResult a = run(*dp, "dp", "predict").results(0).batches(0);
  const v1::BatchResult b = run(*single, "dp-ref", "predict").results(0).batches(0);
  absl::StatusOr<HostTensor> dp_logits = FromProto(a.tensors().at("logits"));
  absl::StatusOr<HostTensor> single_logits = FromProto(b.tensors().at("logits"));
  ASSERT_TRUE(dp_logits.ok() && single_logits.ok());
  EXPECT_EQ(dp_logits->shape, single_logits->shape);
  EXPECT_EQ(dp_logits->shape[0], 64);
  const std::vector<float> x = dp_logits->ToVector<float>(), y = single_logits->ToVector<float>();
  ASSERT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double{x[i]} - y[i]));
  EXPECT_LE(worst, 1e-5);
  absl::StatusOr<HostTensor> dp_labels = FromProto(a.tensors().at("label"));
  absl::StatusOr<HostTensor> single_labels = FromProto(b.tensors().at("label"));
  ASSERT_TRUE(dp_labels.ok() && single_labels.ok());
  EXPECT_EQ(dp_labels->ToVector<int64_t>(), single_labels->ToVector<int64_t>());
}

// accumulate_grad_batches = 2 with batches of B steps exactly as batches of 2B do.
TEST_F(WorkerServiceTest, GradientAccumulation_TwoBatchesOfBEqualOneOf2B) {
  auto acc = StartWorker(), whole = StartWorker();
  ASSERT_TRUE(acc && whole);
  v1::SetupRequest request = MakeSetup("acc", "single_device", 1, address());
  request.mutable_spec()->mutable_trainer()->set_accumulate_grad_batches(2);
  ASSERT_TRUE(Setup(*acc, request).ok());
  ASSERT_TRUE(Setup(*whole, MakeSetup("acc-ref", "single_device", 1, address())).ok());
  for (int step = 0; step < 5; ++step) {
    auto a = Train(*acc, "acc", {Slice(2 * step, 0, 1, 16, 2)});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE(a->results(0).batches(0).optimizer_stepped());
    EXPECT_TRUE(a->results(0).batches(1).optimizer_stepped());
    EXPECT_EQ(a->results(0).global_step(), step + 1);
    ASSERT_TRUE(Train(*whole, "acc-ref", {Slice(step, 0, 1, 32)}).ok());
  }
  EXPECT_LE(MaxDiff(Parameters(*acc, "acc"), Parameters(*whole, "acc-ref")), 1e-5);

  // An epoch's last batch closes the window even when it is not full, and the next epoch
  // starts a fresh one.
  v1::StepRequest odd;
  odd.set_job_id("acc");
  odd.set_end_of_epoch(true);
  *odd.add_work() = Slice(10, 0, 1, 16, 3);
  v1::StepResponse closed;
  ASSERT_TRUE(Call([&](auto* c) { return acc->stub().TrainingStep(c, odd, &closed); }).ok());
  EXPECT_TRUE(closed.results(0).batches(1).optimizer_stepped());
  EXPECT_TRUE(closed.results(0).batches(2).optimizer_stepped()) << "closed by the epoch's end";
  EXPECT_EQ(closed.results(0).global_step(), 7);
  auto fresh = Train(*acc, "acc", {Slice(13, 0, 1, 16, 1)});
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->results(0).batches(0).optimizer_stepped());
}

// A sharded (ZeRO-1, Adam) job's checkpoint: only rank 0 writes, the optimizer state is
// consolidated, and it loads into one rank (another world size) which then takes the same
// next step as the two ranks.
TEST_P(WorkerServiceBackendTest, ShardedCheckpoint_OnlyRankZeroWrites_LoadsIntoOtherWorldSize) {
  auto a = StartWorker(), b = StartWorker(), single = StartWorker();
  ASSERT_TRUE(a && b && single);
  std::vector<WorkerProcess*> ranks = {a.get(), b.get()};
  v1::SetupRequest request = Distributed("zero", "sharded", 2);
  const std::string dir = TestTempPath("zero-dir-" + GetParam());
  std::filesystem::remove_all(dir);
  request.mutable_spec()->mutable_checkpoint()->set_dirpath("worker:" + dir);
  request.mutable_spec()->mutable_optimizer()->set_name("adam");
  request.mutable_spec()->mutable_optimizer()->set_lr(0.01);
  std::vector<v1::SetupResponse> setups(2);
  std::vector<absl::Status> statuses(2);
  Parallel(2, [&](int i) { statuses[i] = Setup(*ranks[i], request, &setups[i]); });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
  if (setups[0].ranks(0).rank() == 1) std::swap(ranks[0], ranks[1]);
  for (int step = 0; step < 6; ++step) {
    Parallel(2, [&](int r) {
      statuses[r] = Train(*ranks[r], "zero", {Slice(step, r, 2, 16)}).status();
    });
    ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
  }
  // The worker writes only inside the job's checkpoint directory: a path, "..", a hidden or
  // odd name is refused before anything is written, naming it.
  for (const std::string bad : {"../escape.ckpt", "/tmp/escape.ckpt", ".hidden", "a b.ckpt", ""}) {
    v1::SaveCheckpointRequest save;
    save.set_job_id("zero");
    save.set_name(bad);
    v1::SaveCheckpointResponse ignored;
    absl::Status s =
        Call([&](auto* c) { return ranks[0]->stub().SaveCheckpoint(c, save, &ignored); });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("not a file name")) << s;
  }
  // A save removes a few checkpoints, never the one it writes.
  {
    v1::SaveCheckpointRequest save;
    save.set_job_id("zero");
    save.set_name("zero.ckpt");
    for (int i = 0; i < 257; ++i) save.add_remove(absl::StrCat("old-", i, ".ckpt"));
    v1::SaveCheckpointResponse ignored;
    absl::Status s =
        Call([&](auto* c) { return ranks[0]->stub().SaveCheckpoint(c, save, &ignored); });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("remove lists 257 checkpoints")) << s;
    save.clear_remove();
    save.add_remove("zero.ckpt");
    s = Call([&](auto* c) { return ranks[0]->stub().SaveCheckpoint(c, save, &ignored); });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("the checkpoint this call writes")) << s;
    EXPECT_FALSE(std::filesystem::exists(dir + "/zero.ckpt"));
  }
  // Where "../escape.ckpt" and "/tmp/escape.ckpt" would have landed.
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir).parent_path() / "escape.ckpt"));
  EXPECT_FALSE(std::filesystem::exists("/tmp/escape.ckpt"));
  const std::string path = dir + "/zero.ckpt";
  {  // an older checkpoint the save evicts (top-k)
    std::ofstream(dir + "/old.ckpt") << "old";
  }
  std::vector<v1::SaveCheckpointResponse> saved(2);
  Parallel(2, [&](int r) {
    v1::SaveCheckpointRequest save;
    save.set_job_id("zero");
    save.set_name("zero.ckpt");
    save.add_remove("old.ckpt");
    save.set_epoch(3);
    statuses[r] =
        Call([&](auto* c) { return ranks[r]->stub().SaveCheckpoint(c, save, &saved[r]); });
  });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
  EXPECT_TRUE(saved[0].written(0));
  EXPECT_FALSE(saved[1].written(0));
  ASSERT_TRUE(std::ifstream(path).good());
  EXPECT_EQ(saved[0].bytes(), static_cast<int64_t>(std::filesystem::file_size(path)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/old.ckpt"));
  // The same Lightning-layout file a single rank writes, read by Python's torch: the whole
  // Adam state (consolidated from both partitions) under every parameter's number.
  CommandResult python = RunShell(
      absl::StrCat("/usr/bin/python3 -c 'import torch; c = torch.load(\"", path,
                   "\"); s = c[\"optimizer_states\"][0][\"state\"]; "
                   "assert c[\"dtrain\"][\"strategy\"] == \"sharded\", c[\"dtrain\"]; "
                   "assert c[\"dtrain\"][\"world_size\"] == 2 and c[\"global_step\"] == 6; "
                   "assert sorted(s) == [0, 1, 2, 3], sorted(s); "
                   "assert all(int(v[\"step\"]) == 6 and \"exp_avg_sq\" in v for v in s.values()); "
                   "print(\"python read\", sorted(c[\"state_dict\"]))'"));
  EXPECT_EQ(python.exit_code, 0) << python.output;
  EXPECT_THAT(python.output, HasSubstr("python read ['fc1_bias', 'fc1_weight', 'fc2_bias'"));

  // Load into a world of one, with plain Adam.
  v1::SetupRequest one = MakeSetup("zero-1", "single_device", 1, address());
  *one.mutable_spec()->mutable_optimizer() = request.spec().optimizer();
  one.mutable_spec()->set_seed_everything(
      99);  // different initial parameters: the checkpoint must overwrite them
  ASSERT_TRUE(Setup(*single, one).ok());
  v1::LoadCheckpointRequest load;
  load.set_job_id("zero-1");
  load.set_path(path);
  v1::LoadCheckpointResponse loaded;
  ASSERT_TRUE(Call([&](auto* c) { return single->stub().LoadCheckpoint(c, load, &loaded); }).ok());
  EXPECT_EQ(loaded.global_step(), 6);
  EXPECT_EQ(loaded.epoch(), 3);
  EXPECT_EQ(MaxDiff(Parameters(*single, "zero-1"), Parameters(*ranks[0], "zero")), 0.0);

  // The next step: the single rank's loss on the whole batch is the mean of the two ranks'
  // losses on its halves, and the Adam update (which needs the consolidated moments) agrees.
  std::vector<double> losses(2);
  Parallel(2, [&](int r) {
    auto out = Train(*ranks[r], "zero", {Slice(6, r, 2, 16)});
    statuses[r] = out.status();
    if (out.ok()) losses[r] = out->results(0).batches(0).scalars().at("loss");
  });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok());
  auto next = Train(*single, "zero-1", {Slice(6, 0, 1, 32)});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NEAR(next->results(0).batches(0).scalars().at("loss"), (losses[0] + losses[1]) / 2, 1e-5);
  EXPECT_LE(MaxDiff(Parameters(*single, "zero-1"), Parameters(*ranks[0], "zero")), 1e-5);

  // A file of weights only (a Lightning checkpoint without optimizer_states), loaded mid-run:
  // the partitions keep their Adam state, as the single rank's optimizer, which loads nothing,
  // keeps its own; the next steps still agree.
  Parallel(2, [&](int r) {
    v1::SaveCheckpointRequest save;
    save.set_job_id("zero");
    save.set_name("now.ckpt");
    v1::SaveCheckpointResponse ignored;
    statuses[r] = Call([&](auto* c) { return ranks[r]->stub().SaveCheckpoint(c, save, &ignored); });
  });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
  const std::string weights = dir + "/weights.ckpt";
  CommandResult strip = RunShell(
      absl::StrCat("/usr/bin/python3 -c 'import torch; c = torch.load(\"", dir,
                   "/now.ckpt\"); del c[\"optimizer_states\"]; torch.save(c, \"", weights, "\")'"));
  ASSERT_EQ(strip.exit_code, 0) << strip.output;
  load.set_job_id("zero");
  load.set_path(weights);
  Parallel(2, [&](int r) {
    v1::LoadCheckpointResponse ignored;
    statuses[r] = Call([&](auto* c) { return ranks[r]->stub().LoadCheckpoint(c, load, &ignored); });
  });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
  for (int step = 7; step < 9; ++step) {
    Parallel(2, [&](int r) {
      statuses[r] = Train(*ranks[r], "zero", {Slice(step, r, 2, 16)}).status();
    });
    ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
    ASSERT_TRUE(Train(*single, "zero-1", {Slice(step, 0, 1, 32)}).ok());
  }
  EXPECT_LE(MaxDiff(Parameters(*single, "zero-1"), Parameters(*ranks[0], "zero")), 1e-5)
      << "a weights-only load restarted the sharded optimizer";

  // A checkpoint that is not there fails every rank with rank 0's message.
  load.set_job_id("zero");
  load.set_path(TestTempPath("no-such.ckpt"));
  Parallel(2, [&](int r) {
    v1::LoadCheckpointResponse ignored;
    statuses[r] = Call([&](auto* c) { return ranks[r]->stub().LoadCheckpoint(c, load, &ignored); });
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("no-such.ckpt"));
  }
}

// A worker killed mid-job: its peer's next step fails, naming the dead rank, within the
// heartbeat timeout (FastOptions'), over every backend.
TEST_P(WorkerServiceBackendTest, DeadPeer_NamedToTheSurvivor) {
  auto a = StartWorker(), b = StartWorker();
  ASSERT_TRUE(a && b);
  std::vector<WorkerProcess*> ranks = {a.get(), b.get()};
  std::vector<v1::SetupResponse> setups(2);
  std::vector<absl::Status> statuses(2);
  Parallel(
      2, [&](int i) { statuses[i] = Setup(*ranks[i], Distributed("dead", "ddp", 2), &setups[i]); });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
  if (setups[0].ranks(0).rank() == 1) std::swap(ranks[0], ranks[1]);
  Parallel(2, [&](int r) { statuses[r] = Train(*ranks[r], "dead", {Slice(0, r, 2, 8)}).status(); });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok());
  ranks[1]->process().Kill(SIGKILL);
  ranks[1]->process().Wait(absl::Seconds(5));
  const absl::Time start = absl::Now();
  auto out = Train(*ranks[0], "dead", {Slice(1, 0, 2, 8)});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kAborted) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("rank 1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The survivor's job is marked failed until torn down; then it serves again.
  EXPECT_EQ(Health(*ranks[0]).state(), v1::HealthResponse::FAILED);
  ASSERT_TRUE(Teardown(*ranks[0]).ok());
  EXPECT_EQ(Health(*ranks[0]).state(), v1::HealthResponse::IDLE);
}

INSTANTIATE_TEST_SUITE_P(Backends, WorkerServiceBackendTest,
                         ::testing::Values("grpc", "gloo", "shm"));

}  // namespace worker_service_strategies_test
}  // namespace dtrain::testing

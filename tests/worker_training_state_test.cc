// The state a worker trains and checkpoints: the optimizers' updates against hand computation
// and their refusals, the learning-rate schedules' values, and checkpoints (a round trip that
// steps on identically, CUDA generator states loaded on a CPU worker, bad files refused clearly).
#include <unistd.h>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/lightning_module.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/precision/precision.h"

namespace dtrain {
namespace worker_training_state_test {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return testing::TestTempPath(name); }

// One parameter p = 1 with loss p^2 / 2 has gradient p: every update is computable by hand.
double OneStep(const OptimizerConfig& config, int steps) {
  torch::Tensor p = torch::ones({1}, torch::kFloat64).requires_grad_(true);
  auto optimizer = MakeOptimizer({p}, config);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  for (int i = 0; i < steps; ++i) {
    (*optimizer)->zero_grad();
    (p * p / 2).sum().backward();
    (*optimizer)->step();
  }
  return p.item<double>();
}

TEST(Optimizers, UpdatesMatchHandComputation) {
  // sgd: p - lr * (g + wd * p) = 1 - 0.1 * (1 + 0.5) = 0.85
  EXPECT_DOUBLE_EQ(OneStep({.name = "sgd", .lr = 0.1, .weight_decay = 0.5}, 1), 0.85);
  // momentum 0.9, two steps: p1 = 0.9 (buf 1); g = 0.9, buf = 0.9 + 0.9 = 1.8, p2 = 0.72
  EXPECT_NEAR(OneStep({.name = "sgd", .lr = 0.1, .momentum = 0.9}, 2), 0.72, 1e-12);
  // nesterov: step 1 uses g + m * buf = 1 + 0.9 = 1.9 -> p = 1 - 0.19 = 0.81
  EXPECT_NEAR(OneStep({.name = "sgd", .lr = 0.1, .momentum = 0.9, .nesterov = true}, 1), 0.81,
              1e-12);
  // adam's first step moves by lr * g / (|g| + eps) ~ lr
  EXPECT_NEAR(OneStep({.name = "adam", .lr = 0.01}, 1), 0.99, 1e-7);
  // adamw: decoupled decay first, p * (1 - lr * wd), then the adam step
  EXPECT_NEAR(OneStep({.name = "adamw", .lr = 0.01, .weight_decay = 0.1}, 1), 1 - 0.001 - 0.01,
              1e-7);
}

TEST(Optimizers, BadConfig_InvalidArgumentNamingTheProblem) {
  torch::Tensor p = torch::ones({1}).requires_grad_(true);
  auto unknown = MakeOptimizer({p}, {.name = "lamb"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown optimizer 'lamb'"));
  EXPECT_EQ(MakeOptimizer({p}, {.name = "sgd", .lr = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto nesterov = MakeOptimizer({p}, {.name = "sgd", .nesterov = true});
  EXPECT_THAT(std::string(nesterov.status().message()), HasSubstr("nesterov needs momentum"));
}

TEST(LrSchedules, StepAndCosineValues) {
  auto step = LrSchedule::Make({.name = "step", .step_size = 10, .gamma = 0.5}, 0.2);
  ASSERT_TRUE(step.ok());
  EXPECT_DOUBLE_EQ(step->LrAt(0), 0.2);
  EXPECT_DOUBLE_EQ(step->LrAt(9), 0.2);
  EXPECT_DOUBLE_EQ(step->LrAt(10), 0.1);
  EXPECT_DOUBLE_EQ(step->LrAt(25), 0.05);
  auto cosine = LrSchedule::Make({.name = "cosine", .total_steps = 100, .min_lr = 0.01}, 0.11);
  ASSERT_TRUE(cosine.ok());
  EXPECT_DOUBLE_EQ(cosine->LrAt(0), 0.11);
  EXPECT_NEAR(cosine->LrAt(50), 0.06, 1e-12);
  EXPECT_NEAR(cosine->LrAt(100), 0.01, 1e-12);
  EXPECT_NEAR(cosine->LrAt(500), 0.01, 1e-12);
  // Apply sets every parameter group.
  torch::Tensor p = torch::ones({1}).requires_grad_(true);
  auto optimizer = MakeOptimizer({p}, {.name = "sgd", .lr = 0.11});
  cosine->Apply(**optimizer, 50);
  EXPECT_NEAR((*optimizer)->param_groups()[0].options().get_lr(), 0.06, 1e-12);
  EXPECT_EQ(LrSchedule::Make({.name = "cyclic"}, 0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LrSchedule::Make({.name = "cosine", .total_steps = -1}, 0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // total_steps 0: the run's length, given once the data is known.
  auto by_run = LrSchedule::Make({.name = "cosine", .total_steps = 0, .min_lr = 0.01}, 0.11);
  ASSERT_TRUE(by_run.ok()) << by_run.status();
  EXPECT_TRUE(by_run->NeedsRunLength());
  EXPECT_EQ(by_run->SetRunLength(0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(by_run->SetRunLength(100).ok());
  EXPECT_FALSE(by_run->NeedsRunLength());
  EXPECT_NEAR(by_run->LrAt(50), 0.06, 1e-12);
}

// One SGD+momentum step on batch `k`; returns the loss before the step.
float StepOn(LightningModule& model, torch::optim::Optimizer& optimizer, int k) {
  const auto [x, y] = SyntheticBatch(16, 500 + k);
  optimizer.zero_grad();
  auto loss = model.TrainingStep(c10::ivalue::Tuple::create({x, y}), k);
  EXPECT_TRUE(loss.ok()) << loss.status();
  loss->backward();
  optimizer.step();
  return loss->item<float>();
}

TEST(Checkpoint, RoundTrip_NextStepsIdentical) {
  const std::string path = TempPath("round-trip.ckpt");
  auto original = BuiltinModel("mlp", 31);
  ASSERT_TRUE(original.ok());
  auto opt_a = MakeOptimizer(original->Parameters(), {.name = "sgd", .lr = 0.05, .momentum = 0.9});
  for (int k = 0; k < 5; ++k) StepOn(*original, **opt_a, k);
  LossScaler scaler;
  scaler.Restore(512, 3);
  ASSERT_TRUE(
      SaveCheckpoint(path, *original, opt_a->get(), &scaler, {.global_step = 5, .epoch = 1}).ok());
  const float next_a = StepOn(*original, **opt_a, 5);
  const float after_a = StepOn(*original, **opt_a, 6);  // depends on the momentum buffers

  auto restored = BuiltinModel("mlp", 99);  // other initial weights, fresh optimizer
  ASSERT_TRUE(restored.ok());
  auto opt_b = MakeOptimizer(restored->Parameters(), {.name = "sgd", .lr = 0.05, .momentum = 0.9});
  LossScaler restored_scaler;
  auto progress = LoadCheckpoint(path, *restored, opt_b->get(), &restored_scaler);
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->global_step, 5);
  EXPECT_EQ(progress->epoch, 1);
  EXPECT_EQ(restored_scaler.scale(), 512);
  EXPECT_EQ(restored_scaler.growth_tracker(), 3);
  EXPECT_EQ(StepOn(*restored, **opt_b, 5), next_a);
  EXPECT_EQ(StepOn(*restored, **opt_b, 6), after_a);
  // Atomic write: nothing left beside the checkpoint.
  EXPECT_FALSE(std::ifstream(path + ".tmp-" + std::to_string(getpid())).good());
}

// A checkpoint carries every CUDA device's generator beside the CPU's. One written on GPUs
// (its rng_cuda list made here in Python, as the keys a CUDA worker writes) loads on this CPU
// worker, which has no CUDA generator to restore, and its CPU generator is restored; a CPU
// worker writes no CUDA states.
TEST(Checkpoint, CudaGeneratorStates_WrittenOnGpus_LoadOnACpuWorker) {
  const std::string path = TempPath("rng-cuda.ckpt");
  auto model = BuiltinModel("mlp", 5);
  ASSERT_TRUE(model.ok());
  torch::manual_seed(1234);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(1234);
  ASSERT_TRUE(SaveCheckpoint(path, *model, nullptr, nullptr, {}).ok());
  const testing::CommandResult edited = testing::RunTorchPython(absl::StrCat(
      "ck = torch.load('", path, "')\n",
      "assert 'rng_cuda' not in ck['dtrain'], 'a CPU worker wrote CUDA generator states'\n",
      "ck['dtrain']['rng_cuda'] = [torch.zeros(16, dtype=torch.uint8)] * 2\n", "torch.save(ck, '",
      path, "')\n"));
  ASSERT_EQ(edited.exit_code, 0) << edited.output;
  torch::manual_seed(99);
  auto progress = LoadCheckpoint(path, *model, nullptr, nullptr);
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected)) << "the CPU generator was not restored";
}

TEST(Checkpoint, BadFiles_ClearErrors) {
  auto model = BuiltinModel("cnn", 1);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(LoadCheckpoint(TempPath("absent.ckpt"), *model, nullptr, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  // A checkpoint of another architecture names the first parameter it cannot restore.
  auto mlp = BuiltinModel("mlp", 1);
  const std::string path = TempPath("mlp.ckpt");
  ASSERT_TRUE(SaveCheckpoint(path, *mlp, nullptr, nullptr, {}).ok());
  auto wrong = LoadCheckpoint(path, *model, nullptr, nullptr);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("conv1_weight"));
  // A TorchScript model file is not a checkpoint.
  const std::string model_path = TempPath("model-not-ckpt.pt");
  ASSERT_TRUE(mlp->Save(model_path).ok());
  auto not_ckpt = LoadCheckpoint(model_path, *mlp, nullptr, nullptr);
  EXPECT_EQ(not_ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  // An unwritable place.
  EXPECT_EQ(SaveCheckpoint("/nonexistent-dir/x.ckpt", *mlp, nullptr, nullptr, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace worker_training_state_test
}  // namespace dtrain

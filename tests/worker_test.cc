// The worker's torch-side building blocks: tensor conversion, the model zoo, loading users'
// TorchScript LightningModules (and refusing bad ones clearly), optimizers and schedules.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <numeric>

#include "tests/reference_data.h"
#include "tests/test_support.h"
#include "worker/accelerator.h"
#include "worker/batch_tree.h"
#include "worker/checkpoint.h"
#include "worker/collective_backend.h"
#include "worker/dataset.h"
#include "worker/gloo_collective_backend.h"
#include "worker/gradient_clipping.h"
#include "worker/gradient_sync.h"
#include "worker/idx_file.h"
#include "worker/lightning_module.h"
#include "worker/model_zoo.h"
#include "worker/optimizers.h"
#include "worker/precision.h"
#include "worker/sharded_optimizer.h"
#include "worker/shared_memory_collective_backend.h"
#include "worker/tensor_convert.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

TEST(TensorConvert, EveryWireDType_RoundTripsBitExactly) {
  for (v1::DType dtype : testing::AllDTypes()) {
    const HostTensor host = testing::MakeInput(dtype, {3, 5}, 1, 7);
    auto t = ToTorch(host);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->sizes(), (std::vector<int64_t>{3, 5}));
    auto back = FromTorch(*t);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, host) << DTypeName(dtype);
  }
  // Values, not just bytes: float32 [1.5, -2] arrives as a torch float tensor.
  auto t = ToTorch(HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {2}, {1.5f, -2.0f}));
  EXPECT_EQ(t->sum().item<float>(), -0.5f);
  // Non-contiguous views are made contiguous.
  auto transposed = FromTorch(torch::arange(6, torch::kInt64).reshape({2, 3}).t());
  EXPECT_EQ(transposed->ToVector<int64_t>(), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorConvert, BadInput_InvalidArgument) {
  HostTensor short_data = HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {3}, {1.0f});
  EXPECT_EQ(ToTorch(short_data).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromTorch(torch::zeros({2}, torch::kComplexFloat)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Ten classes of 28x28 "images": class c lights up rows 2c..2c+2, plus noise. Learnable, fast.
// A generator of its own per batch: ranks in threads must not share torch's global one.
std::pair<torch::Tensor, torch::Tensor> SyntheticBatch(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::Tensor y = torch::randint(0, 10, {n}, gen, torch::kInt64);
  torch::Tensor x = torch::randn({n, 1, 28, 28}, gen) * 0.3;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = y[i].item<int64_t>();
    x.index({i, 0, torch::indexing::Slice(2 * c, 2 * c + 3)}) += 1.0;
  }
  return {x, y};
}

class ZooTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooTest, TrainsOnLearnableData_LossFallsAndAccuracyRises) {
  auto model = BuiltinModel(GetParam(), /*seed=*/3);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->origin(), "builtin:" + GetParam());
  auto optimizer = MakeOptimizer(model->Parameters(), {.name = "sgd", .lr = 0.05, .momentum = 0.9});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  const auto [vx, vy] = SyntheticBatch(256, 99);
  const c10::IValue val = c10::ivalue::Tuple::create({vx, vy});
  auto before = model->ValidationStep(val, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  model->Train(true);
  for (int step = 0; step < 40; ++step) {
    const auto [x, y] = SyntheticBatch(32, step);
    (*optimizer)->zero_grad();
    auto loss = model->TrainingStep(c10::ivalue::Tuple::create({x, y}), step);
    ASSERT_TRUE(loss.ok()) << loss.status();
    loss->backward();
    (*optimizer)->step();
  }
  model->Train(false);
  auto after = model->ValidationStep(val, 0);
  ASSERT_TRUE(after.ok()) << after.status();
  const float loss_before = before->at("loss").item<float>();
  const float loss_after = after->at("loss").item<float>();
  EXPECT_LT(loss_after, loss_before * 0.5f) << "before " << loss_before << " after " << loss_after;
  EXPECT_GT(after->at("acc").item<float>(), 0.9f);
  auto predicted = model->PredictStep(val, 0);
  ASSERT_TRUE(predicted.ok());
  EXPECT_EQ(predicted->at("label").sizes(), (std::vector<int64_t>{256}));
  EXPECT_EQ(predicted->at("logits").sizes(), (std::vector<int64_t>{256, 10}));
}

INSTANTIATE_TEST_SUITE_P(Builtin, ZooTest, ::testing::Values("mlp", "cnn"));

TEST(Zoo, UnknownName_ListsTheZoo) {
  auto model = BuiltinModel("resnet", 1);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("mlp, cnn"));
}

TEST(Zoo, SameSeed_SameParameters) {
  auto a = BuiltinModel("mlp", 11), b = BuiltinModel("mlp", 11), c = BuiltinModel("mlp", 12);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(torch::equal(a->Parameters()[0], b->Parameters()[0]));
  EXPECT_FALSE(torch::equal(a->Parameters()[0], c->Parameters()[0]));
}

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(LightningModuleFile, SavedAndLoaded_SameOutputs) {
  auto model = BuiltinModel("cnn", 5);
  ASSERT_TRUE(model.ok());
  const std::string path = TempPath("cnn.pt");
  ASSERT_TRUE(model->Save(path).ok());
  auto loaded = LightningModule::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const torch::Tensor x = torch::randn({4, 1, 28, 28});
  EXPECT_TRUE(torch::equal(*model->Forward(x), *loaded->Forward(x)));
  EXPECT_TRUE(loaded->HasMethod("validation_step"));
}

TEST(LightningModuleFile, MissingFile_NotFound) {
  auto loaded = LightningModule::Load(TempPath("no-such-model.pt"));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("no-such-model.pt"));
}

TEST(LightningModuleFile, NotTorchScript_InvalidArgumentWithHint) {
  const std::string path = TempPath("garbage.pt");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("not a model", f);
  std::fclose(f);
  auto loaded = LightningModule::Load(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("torch.jit.save"));
}

TEST(LightningModuleFile, NoTrainingStep_InvalidArgument) {
  torch::jit::Module m("Plain");
  m.define("def forward(self, x: Tensor) -> Tensor:\n    return x * 2\n");
  const std::string path = TempPath("plain.pt");
  m.save(path);
  auto loaded = LightningModule::Load(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("no training_step"));
}

TEST(LightningModuleCalls, WrongBatchShape_InvalidArgumentWithLibtorchMessage) {
  auto model = BuiltinModel("mlp", 1);
  ASSERT_TRUE(model.ok());
  const c10::IValue bad =
      c10::ivalue::Tuple::create({torch::randn({4, 100}), torch::zeros({4}, torch::kInt64)});
  auto loss = model->TrainingStep(bad, 0);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loss.status().message()),
              HasSubstr("training_step of model 'builtin:mlp' failed"));
  EXPECT_THAT(std::string(loss.status().message()), HasSubstr("shapes cannot be multiplied"));
  // The module is still usable afterwards.
  const auto [x, y] = SyntheticBatch(4, 1);
  EXPECT_TRUE(model->TrainingStep(c10::ivalue::Tuple::create({x, y}), 1).ok());
}

TEST(LightningModuleCalls, MissingOptionalStep_FailedPrecondition) {
  torch::jit::Module m("OnlyTrain");
  m.register_parameter("w", torch::ones({1}), false);
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum()
)");
  auto model = LightningModule::Wrap(m, "only-train");
  ASSERT_TRUE(model.ok());
  auto out = model->TestStep(c10::ivalue::Tuple::create({torch::ones({2}), torch::ones({2})}), 0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("does not define test_step"));
}

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
  EXPECT_EQ(LrSchedule::Make({.name = "cosine", .total_steps = 0}, 0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Precision, NamesAndAliases) {
  EXPECT_EQ(*ParsePrecision("32"), Precision::k32True);
  EXPECT_EQ(*ParsePrecision("64-true"), Precision::k64True);
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16Mixed);
  EXPECT_EQ(*ParsePrecision("bf16-true"), Precision::kBf16True);
  EXPECT_EQ(*ParsePrecision("16"), Precision::k16Mixed);
  auto bad = ParsePrecision("8-true");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bf16-mixed"));
  EXPECT_EQ(PrecisionName(Precision::kBf16Mixed), "bf16-mixed");
}

TEST(Precision, Fp16MixedOnCpu_FailedPreconditionSuggestingBf16) {
  auto plugin = PrecisionPlugin::Make(Precision::k16Mixed, torch::kCPU);
  EXPECT_EQ(plugin.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plugin.status().message()), HasSubstr("Use bf16-mixed"));
}

// The loss of one step of the mlp on a fixed batch under `precision`, and the dtypes seen.
struct StepSeen {
  float loss;
  torch::ScalarType parameter, loss_dtype, logits;
};
StepSeen StepUnder(Precision precision) {
  auto model = BuiltinModel("mlp", 21);
  EXPECT_TRUE(model.ok());
  auto plugin = PrecisionPlugin::Make(precision, torch::kCPU);
  EXPECT_TRUE(plugin.ok()) << plugin.status();
  (*plugin)->ConnectModule(*model);
  const auto [x, y] = SyntheticBatch(64, 4);
  const c10::IValue batch = (*plugin)->ConvertInput(c10::ivalue::Tuple::create({x, y}));
  EXPECT_EQ(batch.toTupleRef().elements()[1].toTensor().scalar_type(), torch::kInt64);
  auto loss = (*plugin)->Run([&] { return model->TrainingStep(batch, 0); });
  EXPECT_TRUE(loss.ok()) << loss.status();
  auto logits =
      (*plugin)->Run([&] { return model->Forward(batch.toTupleRef().elements()[0].toTensor()); });
  return StepSeen{loss->to(torch::kFloat32).item<float>(), model->Parameters()[0].scalar_type(),
                  loss->scalar_type(), logits->scalar_type()};
}

TEST(Precision, DTypesAsDocumented_AndLossesAgree) {
  const StepSeen fp32 = StepUnder(Precision::k32True);
  EXPECT_EQ(fp32.parameter, torch::kFloat32);
  EXPECT_EQ(fp32.logits, torch::kFloat32);

  const StepSeen fp64 = StepUnder(Precision::k64True);
  EXPECT_EQ(fp64.parameter, torch::kFloat64);
  EXPECT_EQ(fp64.loss_dtype, torch::kFloat64);
  EXPECT_NEAR(fp64.loss, fp32.loss, 1e-4);

  const StepSeen mixed = StepUnder(Precision::kBf16Mixed);
  EXPECT_EQ(mixed.parameter, torch::kFloat32);  // weights stay float32
  EXPECT_EQ(mixed.logits, torch::kBFloat16);    // matmuls run in bfloat16 under autocast
  EXPECT_NEAR(mixed.loss, fp32.loss, 0.02 * fp32.loss);

  const StepSeen bf16 = StepUnder(Precision::kBf16True);
  EXPECT_EQ(bf16.parameter, torch::kBFloat16);
  EXPECT_EQ(bf16.logits, torch::kBFloat16);
  EXPECT_NEAR(bf16.loss, fp32.loss, 0.05 * fp32.loss);

  // Autocast ends with the step: outside Run, the same float32 model computes in float32.
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
}

TEST(LossScaler, ScalesUnscalesSkipsBacksOffAndGrows) {
  LossScaler scaler(
      {.initial_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  torch::Tensor p = torch::ones({2}).requires_grad_(true);
  auto optimizer = MakeOptimizer({p}, {.name = "sgd", .lr = 0.1});
  // A clean step: the scaled loss's gradient, unscaled, is the true gradient.
  scaler.Scale((p * 3).sum()).backward();
  EXPECT_EQ(p.grad()[0].item<float>(), 3 * 1024);
  EXPECT_FALSE(scaler.Unscale({p}));
  EXPECT_EQ(p.grad()[0].item<float>(), 3);
  (*optimizer)->step();
  scaler.Update(false);
  EXPECT_NEAR(p[0].item<float>(), 0.7, 1e-6);
  // An overflowing step: found, skipped (the caller does not step), scale halves.
  (*optimizer)->zero_grad();
  scaler.Scale((p * std::numeric_limits<float>::infinity()).sum()).backward();
  EXPECT_TRUE(scaler.Unscale({p}));
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_NEAR(p[0].item<float>(), 0.7, 1e-6);
  // Three clean steps grow it back.
  for (int i = 0; i < 3; ++i) scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 1024);
  scaler.Restore(64, 2);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 128);
}

// Gradients [3, -4] and [12]: total norm sqrt(9 + 16 + 144) = 13.
std::vector<torch::Tensor> ParamsWithGrads() {
  torch::Tensor a = torch::zeros({2}).requires_grad_(true);
  torch::Tensor b = torch::zeros({1}).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, -4.0f});
  b.mutable_grad() = torch::tensor({12.0f});
  return {a, b};
}

TEST(ClipGradients, ByNorm_ScalesToTheLimit) {
  auto params = ParamsWithGrads();
  auto norm = ClipGradients(params, 6.5, ClipAlgorithm::kNorm);
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, 13.0, 1e-5);
  // Scaled by 6.5 / 13 = 0.5 (torch adds 1e-6 to the norm).
  EXPECT_NEAR(params[0].grad()[0].item<float>(), 1.5, 1e-5);
  EXPECT_NEAR(params[0].grad()[1].item<float>(), -2.0, 1e-5);
  EXPECT_NEAR(params[1].grad()[0].item<float>(), 6.0, 1e-5);
  // Under the limit: untouched.
  auto small = ParamsWithGrads();
  ClipGradients(small, 100, ClipAlgorithm::kNorm).IgnoreError();
  EXPECT_EQ(small[1].grad()[0].item<float>(), 12.0f);
}

TEST(ClipGradients, ByValue_ClampsEachElement) {
  auto params = ParamsWithGrads();
  auto norm = ClipGradients(params, 3.5, ClipAlgorithm::kValue);
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, 13.0, 1e-9);
  EXPECT_EQ(params[0].grad()[0].item<float>(), 3.0f);
  EXPECT_EQ(params[0].grad()[1].item<float>(), -3.5f);
  EXPECT_EQ(params[1].grad()[0].item<float>(), 3.5f);
}

TEST(ClipGradients, BadInput_InvalidArgument) {
  auto params = ParamsWithGrads();
  EXPECT_EQ(ClipGradients(params, 0, ClipAlgorithm::kNorm).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseClipAlgorithm("l1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseClipAlgorithm("value"), ClipAlgorithm::kValue);
}

// Trains `model` for `steps` SGD steps; on step k, `rank` of `world` takes its slice of the
// global batch k. With `sync`, gradients are averaged across ranks after backward.
// With `accumulate` > 1, the rank's slice is split into that many micro-batches whose scaled
// losses accumulate gradients, synchronized only after the last (no sync while accumulating).
absl::Status TrainSlice(LightningModule& model, GradientSync* sync, int rank, int world,
                        int64_t global_batch, int steps, int accumulate = 1) {
  auto optimizer = MakeOptimizer(model.Parameters(), {.name = "sgd", .lr = 0.1, .momentum = 0.9});
  if (!optimizer.ok()) return optimizer.status();
  const int64_t per_rank = global_batch / world;
  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = SyntheticBatch(global_batch, 1000 + step);
    (*optimizer)->zero_grad();
    const int64_t micro = per_rank / accumulate;
    for (int m = 0; m < accumulate; ++m) {
      const int64_t begin = rank * per_rank + m * micro;
      const auto slice = torch::indexing::Slice(begin, begin + micro);
      auto loss = model.TrainingStep(
          c10::ivalue::Tuple::create({x.index({slice}), y.index({slice})}), step);
      if (!loss.ok()) return loss.status();
      if (sync != nullptr && m == accumulate - 1) sync->ExpectSync();
      (*loss / accumulate).backward();
    }
    if (sync != nullptr) {
      if (absl::Status s = sync->AverageGradients(); !s.ok()) return s;
    }
    (*optimizer)->step();
  }
  return absl::OkStatus();
}

TEST(DataParallel, TwoRanksOfBatchB_EqualOneRankOfBatch2B) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  constexpr int kSteps = 20;
  constexpr int64_t kGlobalBatch = 32;
  std::vector<std::vector<torch::Tensor>> trained(2);
  std::vector<size_t> buckets(2), overlapped(2);
  auto statuses = testing::RunRanks(coordinator->address(), "ddp", 2, [&](ProcessGroup& pg) {
    // Different seeds on purpose: the broadcast from rank 0 must make them identical.
    auto model = BuiltinModel("mlp", 100 + pg.rank());
    if (!model.ok()) return model.status();
    // A small bucket size, so that several buckets (not one per parameter) are exercised.
    GrpcCollectiveBackend backend(&pg);
    GradientSync sync(&backend, model->Parameters(), /*bucket_bytes=*/256 * 1024);
    if (absl::Status s = sync.BroadcastParameters(0); !s.ok()) return s;
    if (absl::Status s = TrainSlice(*model, &sync, pg.rank(), 2, kGlobalBatch, kSteps); !s.ok()) {
      return s;
    }
    trained[pg.rank()] = model->Parameters();
    buckets[pg.rank()] = sync.bucket_count();
    overlapped[pg.rank()] = sync.started_during_backward();
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  // mlp, packed in reverse: fc2 + fc1 bias (~11 KiB), then fc1 weight (784 KiB) alone: 2
  // buckets for 4 parameters. Both started from the autograd hooks, during backward.
  EXPECT_EQ(buckets[0], 2u);
  EXPECT_EQ(overlapped[0], 2u);
  EXPECT_EQ(overlapped[1], 2u);

  auto single = BuiltinModel("mlp", 100);
  ASSERT_TRUE(single.ok());
  ASSERT_TRUE(TrainSlice(*single, nullptr, 0, 1, kGlobalBatch, kSteps).ok());
  const std::vector<torch::Tensor> reference = single->Parameters();
  double max_diff = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal(trained[0][i], trained[1][i])) << "ranks differ in parameter " << i;
    max_diff = std::max(max_diff, (trained[0][i] - reference[i]).abs().max().item<double>());
  }
  std::printf("2 ranks x batch %lld vs 1 rank x batch %lld, %d steps: max abs diff %.3g\n",
              static_cast<long long>(kGlobalBatch / 2), static_cast<long long>(kGlobalBatch),
              kSteps, max_diff);
  EXPECT_LE(max_diff, 1e-5);
  // And training did move the parameters (the comparison is not vacuous).
  auto untrained = BuiltinModel("mlp", 100);
  EXPECT_GT((untrained->Parameters()[0] - reference[0]).abs().max().item<double>(), 1e-3);
}

double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  return diff;
}

TEST(GradientAccumulation, TwoMicroBatchesOfB_EqualOneStepOf2B) {
  auto accumulated = BuiltinModel("mlp", 7), whole = BuiltinModel("mlp", 7);
  ASSERT_TRUE(accumulated.ok() && whole.ok());
  ASSERT_TRUE(TrainSlice(*accumulated, nullptr, 0, 1, 32, 20, /*accumulate=*/2).ok());
  ASSERT_TRUE(TrainSlice(*whole, nullptr, 0, 1, 32, 20).ok());
  EXPECT_LE(MaxDiff(accumulated->Parameters(), whole->Parameters()), 1e-5);
}

TEST(GradientAccumulation, WithDdp_SyncOnlyAfterTheLastMicroBatch_EqualsSingleRank) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<std::vector<torch::Tensor>> trained(2);
  auto statuses =
      testing::RunRanks(coordinator->address(), "ddp-accumulate", 2, [&](ProcessGroup& pg) {
        auto model = BuiltinModel("mlp", 7);
        if (!model.ok()) return model.status();
        GrpcCollectiveBackend backend(&pg);
        GradientSync sync(&backend, model->Parameters());
        if (absl::Status s = TrainSlice(*model, &sync, pg.rank(), 2, 32, 20, /*accumulate=*/2);
            !s.ok()) {
          return s;
        }
        trained[pg.rank()] = model->Parameters();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  // One all_reduce per step per rank (default bucket: the whole mlp), none while accumulating.
  EXPECT_EQ(coordinator->engine().SubmittedCount(), 2u * 20u);
  auto single = BuiltinModel("mlp", 7);
  ASSERT_TRUE(TrainSlice(*single, nullptr, 0, 1, 32, 20).ok());
  EXPECT_LE(MaxDiff(trained[0], single->Parameters()), 1e-5);
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

TEST(Sharded, ZeroStage1_EqualsDdpAndPartitionsOptimizerState) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  constexpr int kSteps = 20;
  const OptimizerConfig config{.name = "sgd", .lr = 0.1, .momentum = 0.9};
  std::vector<std::vector<torch::Tensor>> sharded_params(2), ddp_params(2);
  std::vector<size_t> local_counts(2);
  for (const bool sharded : {true, false}) {
    auto statuses = testing::RunRanks(
        coordinator->address(), sharded ? "zero1" : "ddp-ref", 2,
        [&](ProcessGroup& pg) -> absl::Status {
          auto model = BuiltinModel("mlp", 100 + pg.rank());
          if (!model.ok()) return model.status();
          GrpcCollectiveBackend backend(&pg);
          GradientSync sync(&backend, model->Parameters());
          if (absl::Status s = sync.BroadcastParameters(0); !s.ok()) return s;
          std::unique_ptr<ShardedOptimizer> zero;
          std::unique_ptr<torch::optim::Optimizer> plain;
          if (sharded) {
            auto made = ShardedOptimizer::Make(&backend, model->Parameters(), config);
            if (!made.ok()) return made.status();
            zero = std::move(*made);
            local_counts[pg.rank()] = zero->local_parameter_count();
          } else {
            auto made = MakeOptimizer(model->Parameters(), config);
            if (!made.ok()) return made.status();
            plain = std::move(*made);
          }
          for (int step = 0; step < kSteps; ++step) {
            const auto [x, y] = SyntheticBatch(32, 1000 + step);
            const auto slice = torch::indexing::Slice(pg.rank() * 16, (pg.rank() + 1) * 16);
            sharded ? zero->ZeroGrad() : plain->zero_grad();
            auto loss = model->TrainingStep(
                c10::ivalue::Tuple::create({x.index({slice}), y.index({slice})}), step);
            if (!loss.ok()) return loss.status();
            loss->backward();
            if (absl::Status s = sync.AverageGradients(); !s.ok()) return s;
            if (sharded) {
              if (absl::Status s = zero->Step(); !s.ok()) return s;
            } else {
              plain->step();
            }
          }
          (sharded ? sharded_params : ddp_params)[pg.rank()] = model->Parameters();
          return absl::OkStatus();
        });
    for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  }
  // Optimizer state is split: the mlp's 4 parameters, each rank holding some and not all.
  EXPECT_EQ(local_counts[0] + local_counts[1], 4u);
  EXPECT_GT(local_counts[0], 0u);
  EXPECT_GT(local_counts[1], 0u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(MaxDiff(sharded_params[r], ddp_params[0]), 1e-5) << "rank " << r;
  }
  EXPECT_EQ(MaxDiff(sharded_params[0], sharded_params[1]), 0.0);
}

TEST(Accelerator, EveryPrecision_StepsWithTheDocumentedDTypes) {
  const auto [x, y] = SyntheticBatch(32, 21);
  const c10::IValue batch = c10::ivalue::Tuple::create({x, y});
  std::map<Precision, float> losses;
  for (Precision p :
       {Precision::k32True, Precision::k64True, Precision::kBf16Mixed, Precision::kBf16True}) {
    SCOPED_TRACE(PrecisionName(p));
    auto accelerator = Accelerator::Make("cpu", p, StrategyOptions(), nullptr);
    ASSERT_TRUE(accelerator.ok()) << accelerator.status();
    Accelerator& a = **accelerator;
    EXPECT_EQ(a.name(), "cpu");
    EXPECT_EQ(a.root_device(), torch::Device(torch::kCPU));
    EXPECT_EQ(a.strategy().name(), "single_device");
    auto model = BuiltinModel("mlp", 3);
    ASSERT_TRUE(model.ok());
    ASSERT_TRUE(a.Setup(std::move(*model), {.name = "sgd", .lr = 0.1}, {}).ok());
    a.OnTrainStart();
    auto out = a.TrainingStep(batch, 0);
    ASSERT_TRUE(out.ok()) << out.status();
    torch::Tensor loss = a.TrainingStepEnd(*out);
    EXPECT_TRUE(a.results().count("loss"));
    ASSERT_TRUE(a.Backward(loss, /*should_accumulate=*/false).ok());
    const torch::Tensor w = a.model().Parameters()[0];
    EXPECT_EQ(w.scalar_type(), p == Precision::k64True     ? torch::kFloat64
                               : p == Precision::kBf16True ? torch::kBFloat16
                                                           : torch::kFloat32);
    EXPECT_EQ(w.grad().scalar_type(), w.scalar_type());
    const torch::Tensor before = w.detach().clone();
    auto stepped = a.OptimizerStep();
    ASSERT_TRUE(stepped.ok() && *stepped);
    a.UpdateGlobalStep();
    EXPECT_EQ(a.progress().global_step, 1);
    EXPECT_FALSE(torch::equal(before, w.detach())) << "the step moved the weights";
    a.OptimizerZeroGrad();
    EXPECT_EQ(w.grad().abs().sum().item<double>(), 0.0);
    losses[p] = loss.to(torch::kFloat32).item<float>();
  }
  EXPECT_NEAR(losses[Precision::k64True], losses[Precision::k32True], 1e-4);
  EXPECT_NEAR(losses[Precision::kBf16Mixed], losses[Precision::k32True],
              0.02 * losses[Precision::k32True]);
}

TEST(Accelerator, UnavailableHardwareAndStrategies_ClearErrors) {
  auto gpu = ResolveAccelerator("gpu");
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gpu.status().message()), HasSubstr("no CUDA support"));
  EXPECT_EQ(*ResolveAccelerator("auto"), DeviceKind::kCpu);
  EXPECT_EQ(ResolveAccelerator("quantum").status().code(), absl::StatusCode::kInvalidArgument);
  auto fp16 = Accelerator::Make("cpu", Precision::k16Mixed, StrategyOptions(), nullptr);
  EXPECT_EQ(fp16.status().code(), absl::StatusCode::kFailedPrecondition);
  auto tpu = ParseStrategy("tpu_spawn");
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tpu.status().message()), HasSubstr("XLA runtime"));
  EXPECT_EQ(*ParseStrategy("ddp_sharded"), StrategyKind::kSharded);
  EXPECT_EQ(*ParseStrategy(""), StrategyKind::kSingleDevice);
  EXPECT_EQ(ParseStrategy("horovod").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Accelerator, ClipGradients_ReturnsTheNormBeforeClipping) {
  auto accelerator = Accelerator::Make("cpu", Precision::k32True, StrategyOptions(), nullptr);
  ASSERT_TRUE(accelerator.ok());
  auto model = BuiltinModel("mlp", 3);
  ASSERT_TRUE((*accelerator)->Setup(std::move(*model), {}, {}).ok());
  std::vector<torch::Tensor> params = (*accelerator)->model().Parameters();
  double expected_sq = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = torch::full_like(params[i], 0.01 * (i + 1));
    expected_sq += params[i].numel() * std::pow(0.01 * (i + 1), 2);
  }
  auto norm = (*accelerator)->ClipGradients(0.5, ClipAlgorithm::kNorm);
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, std::sqrt(expected_sq), 1e-4 * std::sqrt(expected_sq));  // float32 sums
  double after_sq = 0;
  for (const torch::Tensor& p : params) after_sq += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(after_sq), 0.5, 1e-4);
}

TEST(BatchTree, NestedBatchesMappedSizedAndSplit) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("x", torch::ones({5, 3}));
  c10::impl::GenericList list(c10::TensorType::get());
  list.push_back(torch::arange(5));
  const c10::IValue batch = c10::ivalue::Tuple::create({dict, list});
  EXPECT_EQ(BatchSize(batch), 5);
  auto precision = PrecisionPlugin::Make(Precision::k64True, torch::kCPU);
  const c10::IValue cast = (*precision)->ConvertInput(batch);
  const auto& items = cast.toTupleRef().elements();
  EXPECT_EQ(items[0].toGenericDict().at("x").toTensor().scalar_type(), torch::kFloat64);
  EXPECT_EQ(items[1].toList().get(0).toTensor().scalar_type(), torch::kInt64);
  auto parts = SplitBatch(batch, 2);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ(BatchSize((*parts)[0]), 3);
  EXPECT_EQ(BatchSize((*parts)[1]), 2);
  EXPECT_EQ((*parts)[1].toTupleRef().elements()[1].toList().get(0).toTensor()[0].item<int64_t>(),
            3);
  // Tensors that disagree on dimension 0 cannot be scattered.
  const c10::IValue ragged = c10::ivalue::Tuple::create({torch::ones({4}), torch::ones({3})});
  EXPECT_EQ(SplitBatch(ragged, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

// all_gather(sync_grads=True): rank k's loss is sum_j (k+1)(j+1) * gathered[j], so the gradient
// reaching rank r's input is the sum over k of (k+1)(r+1) = 3(r+1) for two ranks.
TEST(Strategy, AllGatherWithSyncGrads_GradientsFlowBackAcrossRanks) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<torch::Tensor> grads(2), gathered(2);
  auto statuses = testing::RunRanks(
      coordinator->address(), "gather-grad", 2, [&](ProcessGroup& pg) -> absl::Status {
        StrategyOptions options;
        options.kind = StrategyKind::kDdp;
        auto strategy = Strategy::Make(options, std::make_unique<GrpcCollectiveBackend>(&pg));
        if (!strategy.ok()) return strategy.status();
        const int r = pg.rank();
        torch::Tensor x = torch::full({3}, static_cast<float>(r + 10)).requires_grad_();
        auto all = (*strategy)->AllGather(x, /*sync_grads=*/true);
        if (!all.ok()) return all.status();
        gathered[r] = all->detach().clone();
        torch::Tensor weights = torch::tensor({1.0f, 2.0f}).view({2, 1}) * (r + 1);
        (*all * weights).sum().backward();
        grads[r] = x.grad().clone();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        torch::equal(gathered[r], torch::tensor({{10.0f, 10.0f, 10.0f}, {11.0f, 11.0f, 11.0f}})));
    EXPECT_TRUE(torch::allclose(grads[r], torch::full({3}, 3.0f * (r + 1)))) << grads[r];
  }
}

// The real Fashion-MNIST files (Debian's dataset-fashion-mnist, installed by install-deps.sh).
TEST(Dataset, FashionMnist_SplitsShapesAndNormalization) {
  v1::DataSpec spec;
  spec.set_builtin("fashion-mnist");
  auto data = Dataset::Load(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  const auto splits = (*data)->Splits();
  ASSERT_EQ(splits.size(), 3u);
  EXPECT_EQ(splits[0], std::make_pair(std::string("train"), int64_t{55000}));
  EXPECT_EQ(splits[1], std::make_pair(std::string("val"), int64_t{5000}));
  EXPECT_EQ(splits[2], std::make_pair(std::string("test"), int64_t{10000}));
  std::vector<int64_t> all(2000);
  std::iota(all.begin(), all.end(), 0);
  auto batch = (*data)->Batch("train", all);
  ASSERT_TRUE(batch.ok());
  const torch::Tensor x = batch->toTupleRef().elements()[0].toTensor();
  const torch::Tensor y = batch->toTupleRef().elements()[1].toTensor();
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{2000, 1, 28, 28}));
  EXPECT_EQ(x.scalar_type(), torch::kFloat32);
  EXPECT_EQ(y.scalar_type(), torch::kInt64);
  // Normalized with the training set's statistics: mean near 0, std near 1.
  EXPECT_NEAR(x.mean().item<float>(), 0.0, 0.05);
  EXPECT_NEAR(x.std().item<float>(), 1.0, 0.05);
  EXPECT_EQ(y.min().item<int64_t>(), 0);
  EXPECT_EQ(y.max().item<int64_t>(), 9);
  // Labels are balanced across the ten classes (6,000 each in the full set).
  EXPECT_GT(torch::bincount(y).min().item<int64_t>(), 150);
  EXPECT_EQ((*data)->Batch("train", {55000}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*data)->Batch("holdout", {0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Dataset, CorruptIdxFiles_ClearErrors) {
  const std::string plain = TempPath("not-gzip.gz");
  std::ofstream(plain) << "hello";
  // zlib reads a non-gzip file as raw bytes: the IDX check refuses it.
  auto text = ReadIdxGz(plain);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("not an IDX file"));
  EXPECT_EQ(ReadIdxGz(TempPath("absent.gz")).status().code(), absl::StatusCode::kNotFound);
  // An IDX header promising more values than the file holds.
  const std::string truncated = TempPath("truncated.idx");
  std::ofstream(truncated, std::ios::binary)
      << std::string("\x00\x00\x08\x01\x00\x00\x00\x10", 8) << "abc";
  auto short_file = ReadIdxGz(truncated);
  EXPECT_EQ(short_file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_file.status().message()), HasSubstr("should hold 16 values"));
}

// Makes the named backend ("grpc", "gloo" or "shm") over a joined group.
absl::StatusOr<std::unique_ptr<CollectiveBackend>> MakeBackend(const std::string& kind,
                                                               const std::string& address,
                                                               ProcessGroup* pg,
                                                               absl::Duration timeout) {
  if (kind == "grpc") return std::unique_ptr<CollectiveBackend>(new GrpcCollectiveBackend(pg));
  auto gloo = GlooCollectiveBackend::Make(address, pg, timeout);
  if (!gloo.ok() || kind == "gloo") return gloo;
  auto shm = SharedMemoryCollectiveBackend::Make(std::move(*gloo), timeout);
  if (!shm.ok()) return shm.status();
  // On one machine the shared-memory path must be the one under test.
  if (!(*shm)->active()) return absl::InternalError("shm inactive: " + (*shm)->fallback_reason());
  return shm;
}

// The same semantics from every collective backend: the coordinator's gRPC collectives, Gloo
// peer to peer, and shared memory between same-host ranks.
class BackendConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs `body` on `world` ranks, each with this test's backend over its group.
  void RunOnBackends(const std::function<absl::Status(CollectiveBackend&)>& body, int world = 2) {
    auto coordinator = testing::StartCoordinator();
    ASSERT_NE(coordinator, nullptr);
    const std::string address = coordinator->address();
    auto statuses = testing::RunRanks(
        address, "conformance-" + GetParam(), world, [&](ProcessGroup& pg) -> absl::Status {
          auto backend = MakeBackend(GetParam(), address, &pg, absl::Seconds(30));
          if (!backend.ok()) return backend.status();
          return body(**backend);
        });
    for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  }
};

TEST_P(BackendConformance, EveryCollectiveAsDocumented) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    const int r = b.rank();
    auto expect = [&](bool ok, const std::string& what) {
      return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("rank ", r, ": ", what));
    };
    EXPECT_EQ(b.name(), GetParam());
    if (auto s = b.Barrier("start"); !s.ok()) return s;
    torch::Tensor sum = torch::tensor({1.5f, -2.0f}) * (r + 1);
    if (auto s = b.AllReduce(sum, v1::REDUCE_OP_SUM); !s.ok()) return s;
    if (auto s = expect(torch::equal(sum, torch::tensor({4.5f, -6.0f})), "sum"); !s.ok()) return s;
    torch::Tensor mean = torch::tensor({3, -3}, torch::kInt64) + r;  // {3,-3} and {4,-2}
    if (auto s = b.AllReduce(mean, v1::REDUCE_OP_MEAN); !s.ok()) return s;
    // 7 / 2 and -5 / 2 round toward zero.
    if (auto s = expect(torch::equal(mean, torch::tensor({3, -2}, torch::kInt64)), "int mean");
        !s.ok())
      return s;
    torch::Tensor max = torch::tensor({static_cast<double>(r), -static_cast<double>(r)});
    if (auto s = b.AllReduce(max, v1::REDUCE_OP_MAX); !s.ok()) return s;
    if (auto s = expect(torch::equal(max, torch::tensor({1.0, 0.0})), "max"); !s.ok()) return s;
    torch::Tensor flags = torch::tensor({true, false});
    EXPECT_EQ(b.AllReduce(flags, v1::REDUCE_OP_MEAN).code(), absl::StatusCode::kInvalidArgument);
    torch::Tensor from_one = torch::full({3}, static_cast<float>(10 * r));
    if (auto s = b.Broadcast(from_one, 1); !s.ok()) return s;
    if (auto s = expect(torch::equal(from_one, torch::full({3}, 10.0f)), "broadcast"); !s.ok())
      return s;
    auto bytes = b.BroadcastBytes(r == 0 ? std::string("checkpoint\0bytes", 16) : "", 0);
    if (!bytes.ok()) return bytes.status();
    if (auto s = expect(*bytes == std::string("checkpoint\0bytes", 16), "bytes"); !s.ok()) return s;
    // Different first dimensions: rank r gives r + 1 rows.
    auto gathered = b.AllGather(torch::full({r + 1, 2}, static_cast<int32_t>(r), torch::kInt32));
    if (!gathered.ok()) return gathered.status();
    if (auto s = expect(gathered->size() == 2 && (*gathered)[0].size(0) == 1 &&
                            (*gathered)[1].size(0) == 2 && (*gathered)[1].sum().item<int>() == 4,
                        "all_gather");
        !s.ok())
      return s;
    torch::Tensor reduced = torch::tensor({r + 1.0f});
    if (auto s = b.Reduce(reduced, 1, v1::REDUCE_OP_SUM); !s.ok()) return s;
    if (auto s = expect(reduced.item<float>() == (r == 1 ? 3.0f : 1.0f), "reduce"); !s.ok())
      return s;
    auto all = b.ReduceBooleanDecision(r == 0, /*all=*/true);
    auto any = b.ReduceBooleanDecision(r == 0, /*all=*/false);
    if (!all.ok() || !any.ok()) return all.ok() ? any.status() : all.status();
    return expect(!*all && *any, "reduce_boolean_decision");
  });
}

// DDP's gradient averaging gives the same result over either backend.
TEST_P(BackendConformance, GradientSyncAveragesAcrossRanks) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("mlp", 100 + b.rank());
    if (!model.ok()) return model.status();
    GradientSync sync(&b, model->Parameters(), /*bucket_bytes=*/256 * 1024);
    if (auto s = sync.BroadcastParameters(0); !s.ok()) return s;
    for (torch::Tensor& p : model->Parameters())
      p.mutable_grad() = torch::full_like(p, b.rank() + 1.0f);
    if (auto s = sync.AverageGradients(); !s.ok()) return s;
    for (const torch::Tensor& p : model->Parameters()) {
      if (!torch::allclose(p.grad(), torch::full_like(p, 1.5f))) {
        return absl::InternalError("gradients are not the mean over ranks");
      }
    }
    auto reference = BuiltinModel("mlp", 100);
    return torch::equal(model->Parameters()[0], reference->Parameters()[0])
               ? absl::OkStatus()
               : absl::InternalError("parameters are not rank 0's after the broadcast");
  });
}

// Overlap with backward when ranks produce gradients in different orders: rank 0's backward
// touches only bucket 0 (fc2 and fc1's bias), rank 1's only bucket 1 (fc1's weight). Rank 0
// starts bucket 0 from its hook; rank 1 may not start bucket 1 before bucket 0, so both of its
// buckets start when the round closes. The collectives still match, and a gradient that never
// came counts as zeros.
TEST_P(BackendConformance, OverlappedBucketsMatchAcrossRanksWhateverTheReadinessOrder) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("mlp", 100);
    if (!model.ok()) return model.status();
    std::vector<torch::Tensor> p = model->Parameters();  // fc1.w, fc1.b, fc2.w, fc2.b
    GradientSync sync(&b, p, /*bucket_bytes=*/256 * 1024);
    if (sync.bucket_count() != 2) return absl::InternalError("expected 2 buckets");
    sync.ExpectSync();
    torch::Tensor loss =
        b.rank() == 0 ? (2 * (p[1].sum() + p[2].sum() + p[3].sum())) : 4 * p[0].sum();
    loss.backward();
    const size_t started = sync.started_during_backward();
    if (auto s = sync.AverageGradients(); !s.ok()) return s;
    if (started != (b.rank() == 0 ? 1u : 0u)) {
      return absl::InternalError(
          absl::StrCat("rank ", b.rank(), " started ", started, " buckets during backward"));
    }
    const bool means = torch::allclose(p[0].grad(), torch::full_like(p[0], 2.0f)) &&
                       torch::allclose(p[1].grad(), torch::full_like(p[1], 1.0f)) &&
                       torch::allclose(p[2].grad(), torch::full_like(p[2], 1.0f)) &&
                       torch::allclose(p[3].grad(), torch::full_like(p[3], 1.0f));
    return means ? absl::OkStatus() : absl::InternalError("gradients are not the mean over ranks");
  });
}

// Tensors larger than one shared-memory slot (4 MiB) go in several chunks, on 3 ranks so that
// partitions are uneven; values are integers so that float sums are exact.
TEST_P(BackendConformance, LargeAllReducesAcrossChunks_ExactOnEveryRank) {
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int64_t n = 3'000'001;  // 12 MB of float32, an odd count
        const torch::Tensor index = torch::arange(n, torch::kFloat32).remainder(1000);
        const double r = b.rank();
        torch::Tensor sum = index + r;
        if (auto s = b.AllReduce(sum, v1::REDUCE_OP_SUM); !s.ok()) return s;
        torch::Tensor mean = (index * (r + 1)).to(torch::kFloat64);
        if (auto s = b.AllReduce(mean, v1::REDUCE_OP_MEAN); !s.ok()) return s;
        torch::Tensor max = index * (r - 1);  // ranks 0..2: -index, 0, index
        if (auto s = b.AllReduce(max, v1::REDUCE_OP_MAX); !s.ok()) return s;
        torch::Tensor min = index * (r - 1);
        if (auto s = b.AllReduce(min, v1::REDUCE_OP_MIN); !s.ok()) return s;
        // A non-contiguous tensor is reduced in place too.
        torch::Tensor strided = torch::full({4, 6}, static_cast<float>(r + 1)).t();
        if (auto s = b.AllReduce(strided, v1::REDUCE_OP_SUM); !s.ok()) return s;
        const bool ok = torch::equal(sum, index * 3 + 3) &&
                        torch::equal(mean, (index * 2).to(torch::kFloat64)) &&
                        torch::equal(max, index) && torch::equal(min, -index) &&
                        torch::equal(strided, torch::full({6, 4}, 6.0f));
        return ok ? absl::OkStatus()
                  : absl::InternalError(absl::StrCat("rank ", b.rank(), ": wrong reduction"));
      },
      /*world=*/3);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance, ::testing::Values("grpc", "gloo", "shm"));

// Shared memory is loud on misuse: ranks whose calls differ all get FAILED_PRECONDITION
// naming both calls, later calls fail at once, and a rank that never comes is named at the
// deadline.
TEST(SharedMemoryBackend, MismatchedCallsAndAMissingRank_NamedOnEveryRank) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  std::vector<absl::Status> mismatch(2), after(2);
  auto statuses =
      testing::RunRanks(address, "shm-mismatch", 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend("shm", address, &pg, absl::Seconds(30));
        if (!backend.ok()) return backend.status();
        torch::Tensor t = torch::ones({pg.rank() == 0 ? 100 : 200});
        mismatch[pg.rank()] = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        after[pg.rank()] = (*backend)->Barrier("after");
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mismatch[r].code(), absl::StatusCode::kFailedPrecondition) << mismatch[r];
    EXPECT_THAT(std::string(mismatch[r].message()),
                HasSubstr("all_reduce of 100 Float REDUCE_OP_SUM"));
    EXPECT_THAT(std::string(mismatch[r].message()),
                HasSubstr("all_reduce of 200 Float REDUCE_OP_SUM"));
    EXPECT_EQ(after[r].code(), absl::StatusCode::kFailedPrecondition) << after[r];
  }

  absl::Status waited;
  absl::Duration took;
  statuses = testing::RunRanks(address, "shm-missing", 2, [&](ProcessGroup& pg) -> absl::Status {
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(2));
    if (!backend.ok()) return backend.status();
    if (pg.rank() == 1) {
      absl::SleepFor(absl::Seconds(4));  // alive (heartbeating) but never calls
      return absl::OkStatus();
    }
    torch::Tensor t = torch::ones({1000});
    const absl::Time start = absl::Now();
    waited = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
    took = absl::Now() - start;
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("rank(s) 1 did not arrive within 2s"));
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(4));
}

}  // namespace
}  // namespace dtrain

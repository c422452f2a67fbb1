// The Accelerator and its plugins: precision (dtypes, autocast, loss scaling), gradient
// clipping, the per-step operations, and the names every job setting accepts, which the
// worker must parse exactly as the spec does (common/job_settings.h).
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

#include "common/job_settings.h"
#include "tests/reference_data.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
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
    a.SetTrainingMode(true);
    auto out = a.TrainingStep(batch, 0);
    ASSERT_TRUE(out.ok()) << out.status();
    torch::Tensor loss = a.TrainingStepEnd(*out);
    EXPECT_EQ(loss.dim(), 0) << "training_step_end returns the scalar loss";
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

TEST(JobSettingNames, EveryNameTheSpecAcceptsIsKnownToTheWorker) {
  for (const std::string& name : StrategyNames()) {
    EXPECT_TRUE(ParseStrategy(name).ok()) << name;
  }
  for (const std::string& name : PrecisionNames()) {
    EXPECT_TRUE(ParsePrecision(name).ok()) << name;
  }
  for (const std::string& name : ClipAlgorithmNames()) {
    EXPECT_TRUE(ParseClipAlgorithm(name).ok()) << name;
  }
  for (const std::string& name : AcceleratorNames()) {
    // gpu and cuda need CUDA: refused as unavailable here, never as unknown.
    const absl::StatusCode code = ResolveAccelerator(name).status().code();
    EXPECT_NE(code, absl::StatusCode::kInvalidArgument) << name;
  }
  for (const std::string& name : OptimizerNames()) {
    OptimizerConfig config;
    config.name = name;
    EXPECT_TRUE(MakeOptimizer({torch::zeros({1}, torch::requires_grad())}, config).ok()) << name;
  }
  for (const std::string& name : SchedulerNames()) {
    SchedulerConfig config;
    config.name = name;
    config.total_steps = 10;
    EXPECT_TRUE(LrSchedule::Make(config, 0.1).ok()) << name;
  }
  for (const std::string& name : BuiltinModelNames()) {
    EXPECT_TRUE(BuiltinModel(name, 1).ok()) << name;
  }
}

}  // namespace
}  // namespace dtrain

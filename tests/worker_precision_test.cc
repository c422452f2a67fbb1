// Precision on the worker: its names and aliases, each plugin's dtypes and autocast scope,
// training losses under each precision against 32-true's, and the loss scaler of 16-mixed, on
// its own and through the Accelerator step for step against torch's GradScaler.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/model/lightning_module.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/precision/precision.h"
#include "worker/runtime/accelerator.h"
#include "worker/runtime/gradient_clipping.h"
#include "worker/runtime/registered_plugins.h"

namespace dtrain {
namespace worker_precision_test {

using ::dtrain::testing::CommandResult;
using ::dtrain::testing::RunShell;
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

TEST(Precision, DTypesAsDocumented) {
  const StepSeen fp32 = StepUnder(Precision::k32True);
  EXPECT_EQ(fp32.parameter, torch::kFloat32);
  EXPECT_EQ(fp32.logits, torch::kFloat32);

  const StepSeen fp64 = StepUnder(Precision::k64True);
  EXPECT_EQ(fp64.parameter, torch::kFloat64);
  EXPECT_EQ(fp64.loss_dtype, torch::kFloat64);

  const StepSeen mixed = StepUnder(Precision::kBf16Mixed);
  EXPECT_EQ(mixed.parameter, torch::kFloat32);  // weights stay float32
  EXPECT_EQ(mixed.logits, torch::kBFloat16);    // matmuls run in bfloat16 under autocast

  const StepSeen bf16 = StepUnder(Precision::kBf16True);
  EXPECT_EQ(bf16.parameter, torch::kBFloat16);
  EXPECT_EQ(bf16.logits, torch::kBFloat16);

  // Autocast ends with the step: outside Run, the same float32 model computes in float32.
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
}

TEST(Precision, AutocastScope_EnablesThePlannedAutocastAndRestoresIt) {
  auto plugin = PrecisionPlugin::Make(Precision::kBf16Mixed, torch::kCPU);
  ASSERT_TRUE(plugin.ok());
  ASSERT_FALSE(at::autocast::is_cpu_enabled());
  const bool inside = (*plugin)->Run([] { return at::autocast::is_cpu_enabled(); });
  const auto dtype = (*plugin)->Run([] { return at::autocast::get_autocast_cpu_dtype(); });
  EXPECT_TRUE(inside);
  EXPECT_EQ(dtype, torch::kBFloat16);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_FALSE(at::autocast::is_enabled()) << "CUDA autocast stays off on a CPU device";
}

// float32 with 16-mixed's dynamic loss scaling: the only way to run the loss scaler through the
// Accelerator on a CPU (libtorch 1.13 has no float16 autocast there). Scaling by a power of two
// and unscaling are exact in float32, so it must train as 32-true does.
constexpr char kLossScaled32[] = "test-32-loss-scaled";
void RegisterLossScaled32() {
  static const absl::Status registered = PluginRegistry::Global().AddPrecision(
      kLossScaled32, Precision::k32True,
      [](const AutocastPlan& plan) -> absl::StatusOr<std::unique_ptr<PrecisionPlugin>> {
        AutocastPlan scaled = plan;
        scaled.loss_scaling = true;
        return PrecisionPlugin::Make(Precision::k32True, scaled);
      },
      "float32 with dynamic loss scaling (worker_precision_test)");
  ASSERT_TRUE(registered.ok()) << registered;
}

// The loss of each of `steps` SGD steps of the mlp through the Accelerator under `precision`
// (its casts, autocast and loss scaling, backward and the optimizer step), a new batch a step.
std::vector<double> TrainingLosses(const std::string& precision, int steps) {
  std::vector<double> losses;
  auto accelerator = Accelerator::Make("cpu", precision, StrategyOptions(), nullptr);
  EXPECT_TRUE(accelerator.ok()) << accelerator.status();
  if (!accelerator.ok()) return losses;
  Accelerator& a = **accelerator;
  auto model = BuiltinModel("mlp", 3);
  EXPECT_TRUE(model.ok());
  EXPECT_TRUE(a.Setup(std::move(*model), {.name = "sgd", .lr = 0.1}, {}).ok());
  a.SetTrainingMode(true);
  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = SyntheticBatch(64, 500 + step);
    auto out = a.TrainingStep(c10::ivalue::Tuple::create({x, y}), step);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return losses;
    const torch::Tensor loss = a.TrainingStepEnd(*out);
    EXPECT_TRUE(a.Backward(loss, /*should_accumulate=*/false).ok());
    auto stepped = a.OptimizerStep();
    EXPECT_TRUE(stepped.ok() && *stepped) << precision << " skipped step " << step;
    a.UpdateGlobalStep();
    a.OptimizerZeroGrad();
    losses.push_back(loss.to(torch::kFloat64).item<double>());
  }
  return losses;
}

// The largest |loss - reference| / reference over the steps.
double MaxRelativeDeviation(const std::vector<double>& losses,
                            const std::vector<double>& reference) {
  EXPECT_EQ(losses.size(), reference.size());
  double worst = 0;
  for (size_t i = 0; i < losses.size() && i < reference.size(); ++i) {
    const double d = std::abs(losses[i] - reference[i]) / std::abs(reference[i]);
    worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
  }
  return worst;
}

// Every precision trains as 32-true does, to within what its dtype can hold, step after step
// while the loss falls (not only at initialisation, where any model's loss is about ln 10).
// The bands are multiples of the dtype's unit roundoff (2^-24 for float32, 2^-8 for bfloat16)
// measured with margin, and tight enough that a plugin that does not cast, casts the master
// weights, or scales without unscaling (or the reverse) falls outside them.
TEST(Precision, TrainingLossesTrackFloat32WithinTheDTypesPrecision) {
  ASSERT_NO_FATAL_FAILURE(RegisterLossScaled32());
  constexpr int kSteps = 40;
  const std::vector<double> fp32 = TrainingLosses("32-true", kSteps);
  ASSERT_EQ(fp32.size(), static_cast<size_t>(kSteps));
  // The run learns: the comparison is between moving curves.
  EXPECT_LT(fp32.back(), 0.25 * fp32.front()) << "float32 did not learn";

  const double fp64 = MaxRelativeDeviation(TrainingLosses("64-true", kSteps), fp32);
  const double scaled = MaxRelativeDeviation(TrainingLosses(kLossScaled32, kSteps), fp32);
  const double mixed = MaxRelativeDeviation(TrainingLosses("bf16-mixed", kSteps), fp32);
  const double bf16 = MaxRelativeDeviation(TrainingLosses("bf16-true", kSteps), fp32);
  std::printf(
      "largest relative deviation from 32-true over %d steps: 64-true %.3g, 32 with "
      "loss scaling %.3g, bf16-mixed %.3g, bf16-true %.3g\n",
      kSteps, fp64, scaled, mixed, bf16);
  // Measured (40 steps, lr 0.1): 64-true 2.8e-7 (4.6 float32 roundoffs), loss-scaled float32
  // exactly 0, bf16-mixed 0.0029 (0.73 bfloat16 roundoffs), bf16-true 0.029 (7.4). Scratch
  // mutations each bound caught: bf16-mixed without autocast (0), or with its master weights
  // cast to bfloat16 (0.026); loss scaling that never unscales (inf), or unscales a loss it
  // did not scale (32: the run stops learning).
  constexpr double kFloat32Roundoff = 0x1p-24, kBfloat16Roundoff = 0x1p-8;
  EXPECT_LE(fp64, 64 * kFloat32Roundoff);
  EXPECT_LE(scaled, 64 * kFloat32Roundoff);
  // bfloat16: its rounding shows (a plugin that did not cast would match float32 to a few
  // float32 roundoffs), and stays within 2 of its roundoffs while the master weights are float32.
  EXPECT_GT(mixed, 0.05 * kBfloat16Roundoff) << "bf16-mixed computed in float32";
  EXPECT_LE(mixed, 2 * kBfloat16Roundoff);
  EXPECT_GT(bf16, 0.05 * kBfloat16Roundoff) << "bf16-true computed in float32";
  EXPECT_LE(bf16, 16 * kBfloat16Roundoff);
}

TEST(LossScaler, ScalesUnscalesSkipsBacksOffAndGrows) {
  LossScaler scaler(
      {.initial_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  torch::Tensor p = torch::ones({2}).requires_grad_(true);
  auto optimizer = MakeOptimizer({p}, {.name = "sgd", .lr = 0.1});
  // A clean step: the scaled loss's gradient, unscaled, is the true gradient.
  scaler.Scale((p * 3).sum()).backward();
  EXPECT_EQ(p.grad()[0].item<float>(), 3 * 1024);
  EXPECT_FALSE(*scaler.Unscale({p}));
  EXPECT_EQ(p.grad()[0].item<float>(), 3);
  (*optimizer)->step();
  scaler.Update(false);
  EXPECT_NEAR(p[0].item<float>(), 0.7, 1e-6);
  // An overflowing step: found, skipped (the caller does not step), scale halves.
  (*optimizer)->zero_grad();
  scaler.Scale((p * std::numeric_limits<float>::infinity()).sum()).backward();
  EXPECT_TRUE(*scaler.Unscale({p}));
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

// The scale is float32, as GradScaler's: a float16 loss is not scaled into float16's inf
// (65536 is above its largest value, 65504), and growth that would overflow float32 is not done.
TEST(LossScaler, ScalesInFloat32_RefusesFloat16Gradients_StopsGrowingAtFloat32sLimit) {
  LossScaler scaler;
  const torch::Tensor scaled = scaler.Scale(torch::tensor(2.0).to(torch::kHalf));
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat32);
  EXPECT_EQ(scaled.item<float>(), 131072.0f);
  torch::Tensor half = torch::ones({2}, torch::kHalf).requires_grad_(true);
  half.mutable_grad() = torch::ones({2}, torch::kHalf);
  const absl::StatusOr<bool> refused = scaler.Unscale({half});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("float32"));
  LossScaler top({.growth_interval = 1});
  top.Restore(0x1p127, 0);
  top.Update(false);
  EXPECT_EQ(top.scale(), 0x1p127) << "2^128 is inf in float32: GradScaler keeps the scale";
  EXPECT_EQ(top.growth_tracker(), 0);
}

// A sparse gradient (an embedding's, sparse=True) is unscaled in place, duplicates and all, as
// GradScaler does: coalescing first would unscale a copy and step with the scaled gradient.
TEST(LossScaler, UncoalescedSparseGradient_UnscaledInPlace) {
  LossScaler scaler({.initial_scale = 1024});
  torch::Tensor p = torch::zeros({3}).requires_grad_(true);
  // Index 0 twice: uncoalesced, values 2 and 4 (times the scale).
  p.mutable_grad() = torch::sparse_coo_tensor(torch::tensor({{0, 0}}, torch::kInt64),
                                              torch::tensor({2.0f * 1024, 4.0f * 1024}), {3});
  ASSERT_FALSE(p.grad().is_coalesced());
  auto found_inf = scaler.Unscale({p});
  ASSERT_TRUE(found_inf.ok()) << found_inf.status();
  EXPECT_FALSE(*found_inf);
  EXPECT_TRUE(torch::equal(p.grad().to_dense(), torch::tensor({6.0f, 0.0f, 0.0f})))
      << p.grad().to_dense();
  p.grad()._values()[1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(*scaler.Unscale({p})) << "an inf among a sparse gradient's values was missed";
}

// A model that computes in float16 on the CPU, as autocast would on CUDA: float32 parameters,
// float16 products, a float16 loss.
absl::StatusOr<LightningModule> Float16Toy() {
  torch::jit::Module m("Float16Toy");
  m.register_parameter("w", torch::tensor({0.5f, -0.25f, 0.125f, 1.0f}).requires_grad_(), false);
  m.register_parameter("b", torch::tensor({0.1f}).requires_grad_(), false);
  m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    return x.half() * self.w.half() + self.b.half()

def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    x, y = batch
    d = self.forward(x) - y.half()
    return (d * d).sum()
)");
  return LightningModule::Wrap(m, "Float16Toy");
}

// The whole 16-mixed path through the Accelerator (scale, backward, unscale, clip by norm,
// skip on inf/nan, scale update), step for step equal to torch's GradScaler run on the same
// float16 model (tests/python/grad_scaler_reference.py): the same losses, the same skipped
// steps (gradients that overflow float16, and a forward that does), the same scales after a
// backoff and a growth, and bit-identical parameters.
TEST(LossScaler, WholePathThroughTheAccelerator_EqualsTorchsGradScaler) {
  // Its stdout is the data; its stderr, shown when it fails, says why.
  const std::string script =
      "/usr/bin/python3 -O " DTRAIN_SOURCE_DIR "/tests/python/grad_scaler_reference.py";
  const CommandResult reference = RunShell(script + " 2>/dev/null");
  ASSERT_EQ(reference.exit_code, 0) << RunShell(script + " 2>&1").output;
  ASSERT_NO_FATAL_FAILURE(RegisterLossScaled32());
  auto accelerator = Accelerator::Make("cpu", kLossScaled32, StrategyOptions(), nullptr);
  ASSERT_TRUE(accelerator.ok()) << accelerator.status();
  Accelerator& a = **accelerator;
  auto model = Float16Toy();
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(a.Setup(std::move(*model), {.name = "sgd", .lr = 0.1}, {}).ok());
  a.SetTrainingMode(true);
  LossScaler& scaler = *a.precision().scaler();
  int steps = 0, stepped_steps = 0, skipped_steps = 0;
  c10::IValue batch;
  for (absl::string_view line : absl::StrSplit(reference.output, '\n', absl::SkipEmpty())) {
    std::vector<double> v;
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    for (size_t i = 1; i < words.size(); ++i) {
      double d;
      ASSERT_TRUE(absl::SimpleAtod(words[i], &d)) << line;
      v.push_back(d);
    }
    if (words[0] == "batch") {
      ASSERT_EQ(v.size(), 17u) << line;
      if (v[0] >= 0) scaler.Restore(scaler.scale(), static_cast<int64_t>(v[0]));
      const torch::Tensor xy =
          torch::tensor(std::vector<double>(v.begin() + 1, v.end())).to(torch::kFloat32);
      batch = c10::ivalue::Tuple::create(
          {xy.slice(0, 0, 8).view({2, 4}).clone(), xy.slice(0, 8, 16).view({2, 4}).clone()});
      continue;
    }
    ASSERT_EQ(words[0], "expect");
    ASSERT_EQ(v.size(), 8u) << line;
    SCOPED_TRACE(absl::StrCat("step ", steps));
    auto out = a.TrainingStep(batch, steps);
    ASSERT_TRUE(out.ok()) << out.status();
    const torch::Tensor loss = a.TrainingStepEnd(*out);
    EXPECT_EQ(loss.scalar_type(), torch::kHalf);
    const float got_loss = loss.to(torch::kFloat32).item<float>();
    EXPECT_TRUE(got_loss == v[0] || (std::isinf(got_loss) && std::isinf(v[0])))
        << got_loss << " vs " << v[0];
    const absl::Status backward = a.Backward(loss, /*should_accumulate=*/false);
    ASSERT_TRUE(backward.ok()) << backward;
    ASSERT_TRUE(a.ClipGradients(1.0, ClipAlgorithm::kNorm).ok());
    auto stepped = a.OptimizerStep();
    ASSERT_TRUE(stepped.ok()) << stepped.status();
    EXPECT_EQ(*stepped, v[1] != 0);
    (*stepped ? stepped_steps : skipped_steps)++;
    EXPECT_EQ(scaler.scale(), v[2]);
    const std::vector<torch::Tensor> params = a.model().Parameters();
    ASSERT_EQ(params.size(), 2u);
    const torch::Tensor flat = torch::cat({params[0].detach(), params[1].detach()});
    for (int i = 0; i < 5; ++i) EXPECT_EQ(flat[i].item<float>(), v[3 + i]) << "parameter " << i;
    a.OptimizerZeroGrad();
    ++steps;
  }
  EXPECT_EQ(steps, 10);
  // The reference's run holds both outcomes, or the comparison would prove little.
  EXPECT_GE(stepped_steps, 3);
  EXPECT_GE(skipped_steps, 3);
}

}  // namespace worker_precision_test
}  // namespace dtrain

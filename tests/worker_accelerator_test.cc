// The Accelerator: its device plans (this machine's, and a simulated one of four CUDA devices),
// the per-step operations under each precision, gradient clipping, dp's replicas and reductions,
// and the names every job setting and every catalog entry give, which the worker must accept
// exactly as the spec does (common/job_settings.h, common/plugin_catalog.h). Precision itself
// and loss scaling: worker_precision_test.cc.
#include <cmath>
#include <string>
#include <typeinfo>
#include <vector>

#include <ATen/detail/CUDAHooksInterface.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_settings.h"
#include "common/plugin_catalog.h"
#include "tests/worker_test_helpers.h"
#include "worker/model/lightning_module.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/precision/device_plan.h"
#include "worker/precision/precision.h"
#include "worker/runtime/accelerator.h"
#include "worker/runtime/gradient_clipping.h"
#include "worker/runtime/registered_plugins.h"
#include "worker/strategies/data_parallel_strategy.h"
#include "worker/strategies/module_replica.h"

namespace dtrain {
namespace worker_accelerator_test {

using ::testing::HasSubstr;
using ::testing::Not;

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
    const torch::Tensor spent = w.grad().clone();
    ASSERT_GT(spent.abs().sum().item<double>(), 0.0);
    a.OptimizerZeroGrad();
    // As Lightning's closure zeroes right before backward, the spent gradients stay readable
    // until then (a checkpoint or a hook between steps sees them)...
    EXPECT_TRUE(torch::equal(w.grad(), spent));
    // ...and the next backward starts from none: w.grad is that backward's gradient alone.
    auto again = a.TrainingStep(batch, 1);
    ASSERT_TRUE(again.ok()) << again.status();
    torch::Tensor loss2 = a.TrainingStepEnd(*again);
    const torch::Tensor expected =
        torch::autograd::grad({loss2}, {w}, {}, /*retain_graph=*/true)[0];
    ASSERT_TRUE(a.Backward(loss2, /*should_accumulate=*/false).ok());
    EXPECT_TRUE(torch::equal(w.grad(), expected));
    EXPECT_TRUE(std::isfinite(loss.to(torch::kFloat32).item<float>()));
  }
  // How the losses compare across precisions: TrainingLossesTrackFloat32WithinTheDTypesPrecision.
}

// Gradients are set to none before each window's backward; a parameter that had one and that
// this backward does not reach still gets zeros, so SGD's momentum keeps moving it exactly as
// when gradients were zeroed in place (libtorch 1.13's zero_grad, the reference here).
TEST(Accelerator, ParameterTheBackwardDoesNotReach_StepsAsWithGradientsZeroedInPlace) {
  auto model = BuiltinModel("mlp", 3);
  auto reference_model = BuiltinModel("mlp", 3);
  ASSERT_TRUE(model.ok() && reference_model.ok());
  auto accelerator = Accelerator::Make("cpu", Precision::k32True, StrategyOptions(), nullptr);
  ASSERT_TRUE(accelerator.ok()) << accelerator.status();
  Accelerator& a = **accelerator;
  ASSERT_TRUE(a.Setup(std::move(*model), {.name = "sgd", .lr = 0.1, .momentum = 0.9}, {}).ok());
  const std::vector<torch::Tensor> params = a.model().Parameters();
  const std::vector<torch::Tensor> reference = reference_model->Parameters();
  ASSERT_EQ(params.size(), reference.size());
  torch::optim::SGD sgd(reference, torch::optim::SGDOptions(0.1).momentum(0.9));
  // Step 1 reaches every parameter; step 2 only the first.
  ASSERT_TRUE(a.Backward(SumOfSquares(params, params.size()), /*should_accumulate=*/false).ok());
  ASSERT_TRUE(a.OptimizerStep().ok());
  a.UpdateGlobalStep();
  a.OptimizerZeroGrad();
  SumOfSquares(reference, reference.size()).backward();
  sgd.step();
  sgd.zero_grad();
  const torch::Tensor after_first = params[1].detach().clone();
  ASSERT_TRUE(a.Backward(SumOfSquares(params, 1), /*should_accumulate=*/false).ok());
  EXPECT_EQ(params[1].grad().abs().sum().item<double>(), 0.0) << "zeros, not none";
  ASSERT_TRUE(a.OptimizerStep().ok());
  SumOfSquares(reference, 1).backward();
  sgd.step();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], reference[i])) << "parameter " << i;
  }
  EXPECT_FALSE(torch::equal(params[1], after_first)) << "momentum moved the unreached parameter";
}

TEST(Accelerator, UnavailableHardwareAndStrategies_ClearErrors) {
  auto gpu = ResolveAccelerator("gpu");
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gpu.status().message()), HasSubstr("no CUDA support"));
  EXPECT_EQ(*ResolveAccelerator("auto"), DeviceKind::kCpu);
  EXPECT_EQ(ResolveAccelerator("quantum").status().code(), absl::StatusCode::kInvalidArgument);
  auto fp16 = Accelerator::Make("cpu", Precision::k16Mixed, StrategyOptions(), nullptr);
  EXPECT_EQ(fp16.status().code(), absl::StatusCode::kFailedPrecondition);
  auto tpu = ResolveStrategy("tpu_spawn");
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tpu.status().message()), HasSubstr("XLA runtime"));
  EXPECT_EQ(ResolveStrategy("ddp_sharded")->info.name, "sharded");
  auto horovod = ResolveStrategy("horovod");
  EXPECT_EQ(horovod.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(horovod.status().message()),
              HasSubstr("this worker has ddp, ddp_spawn, dp, sharded, single_device"));
}

// The device decisions, from a device table: this machine's (no CUDA) and a simulated one of
// four CUDA devices, which no test machine here has.
DeviceRequest Request(const std::string& accelerator, Precision precision, bool dp = false,
                      int devices = 1, int local_rank = 0) {
  DeviceRequest r;
  r.accelerator = accelerator;
  r.precision = precision;
  r.data_parallel = dp;
  r.devices = devices;
  r.local_rank = local_rank;
  return r;
}

TEST(DevicePlan, CpuOnlyTable_EveryReplicaOnTheCpu_Bf16AutocastOnCpu_Fp16Refused) {
  const DeviceTable cpu_only;  // no CUDA build, no device
  EXPECT_EQ(AutoDeviceCount(cpu_only), 1);
  // No default here: the spec's (cpu) is applied before a plan is asked for.
  EXPECT_EQ(PlanDevices(Request("", Precision::k32True), cpu_only).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* name : {"cpu", "auto"}) {
    auto plan = PlanDevices(Request(name, Precision::k32True), cpu_only);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
    EXPECT_EQ(plan->kind, DeviceKind::kCpu) << name;
    EXPECT_EQ(plan->root, torch::Device(torch::kCPU));
    EXPECT_EQ(plan->replicas.size(), 1u);
    EXPECT_FALSE(plan->autocast.enabled);
  }
  auto dp = PlanDevices(Request("cpu", Precision::k32True, /*dp=*/true, 3), cpu_only);
  ASSERT_TRUE(dp.ok());
  EXPECT_EQ(dp->replicas, std::vector<torch::Device>(3, torch::Device(torch::kCPU)));

  auto bf16 = PlanDevices(Request("cpu", Precision::kBf16Mixed), cpu_only);
  ASSERT_TRUE(bf16.ok());
  EXPECT_TRUE(bf16->autocast.enabled);
  EXPECT_EQ(bf16->autocast.device, torch::kCPU);
  EXPECT_EQ(bf16->autocast.dtype, torch::kBFloat16);
  EXPECT_FALSE(bf16->autocast.loss_scaling);
  for (Precision p : {Precision::k64True, Precision::kBf16True}) {
    EXPECT_FALSE(PlanDevices(Request("cpu", p), cpu_only)->autocast.enabled);
  }
  auto fp16 = PlanDevices(Request("cpu", Precision::k16Mixed), cpu_only);
  EXPECT_EQ(fp16.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fp16.status().message()), HasSubstr("Use bf16-mixed"));

  auto gpu = PlanDevices(Request("gpu", Precision::k32True), cpu_only);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gpu.status().message()), HasSubstr("no CUDA support"));
  // A CUDA build without a driver names the driver, not the build; with a driver and no
  // visible device, CUDA_VISIBLE_DEVICES.
  DeviceTable built_no_driver;
  built_no_driver.cuda_built = true;
  auto no_driver = PlanDevices(Request("cuda", Precision::k32True), built_no_driver);
  EXPECT_EQ(no_driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(no_driver.status().message()), HasSubstr("no NVIDIA driver is loaded"));
  EXPECT_THAT(std::string(no_driver.status().message()), Not(HasSubstr("no CUDA support")));
  DeviceTable hidden = built_no_driver;
  hidden.nvidia_driver = true;
  auto no_device = PlanDevices(Request("cuda", Precision::k32True), hidden);
  EXPECT_EQ(no_device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(no_device.status().message()), HasSubstr("libtorch sees no CUDA device"));
  EXPECT_THAT(std::string(no_device.status().message()),
              HasSubstr("CUDA_VISIBLE_DEVICES hides them"));
  EXPECT_THAT(std::string(no_device.status().message()), HasSubstr("a driver older than"));
  // A CPU build of libtorch (Debian's; its CUDA hooks are the interface's defaults) is not
  // taken for a CUDA one.
  if (typeid(at::detail::getCUDAHooks()) == typeid(at::CUDAHooksInterface)) {
    EXPECT_FALSE(DeviceTable::Detect().cuda_built);
  }
  auto tpu = PlanDevices(Request("tpu", Precision::k32True), cpu_only);
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tpu.status().message()), HasSubstr("XLA runtime"));
  EXPECT_EQ(PlanDevices(Request("quantum", Precision::k32True), cpu_only).status().code(),
            absl::StatusCode::kInvalidArgument);
  // What this machine has: the same as the CPU-only table.
  EXPECT_EQ(AutoDeviceCount(DeviceTable::Detect()), 1);
}

TEST(DevicePlan, FourCudaDevices_ReplicaIOnCudaI_AutocastOnCuda_TooManyRefused) {
  DeviceTable four;
  four.cuda_built = true;
  four.cuda_devices = 4;
  EXPECT_EQ(AutoDeviceCount(four), 4);
  auto dp = PlanDevices(Request("auto", Precision::k32True, /*dp=*/true, 4), four);
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ(dp->kind, DeviceKind::kGpu);
  ASSERT_EQ(dp->replicas.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dp->replicas[i], torch::Device(torch::kCUDA, i));
  EXPECT_EQ(dp->root, torch::Device(torch::kCUDA, 0));
  auto five = PlanDevices(Request("gpu", Precision::k32True, /*dp=*/true, 5), four);
  EXPECT_EQ(five.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(five.status().message()), HasSubstr("5 replicas needs 5 CUDA devices"));
  EXPECT_THAT(std::string(five.status().message()), HasSubstr("this worker has 4"));
  // One rank per process (ddp, ddp_spawn): its local rank picks its device.
  for (int local = 0; local < 4; ++local) {
    auto rank = PlanDevices(Request("gpu", Precision::k32True, false, 1, local), four);
    ASSERT_TRUE(rank.ok());
    EXPECT_EQ(rank->root, torch::Device(torch::kCUDA, local));
    EXPECT_EQ(rank->replicas.size(), 1u);
  }
  auto fifth = PlanDevices(Request("gpu", Precision::k32True, false, 1, 4), four);
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fifth.status().message()), HasSubstr("this host has 4"));

  auto fp16 = PlanDevices(Request("gpu", Precision::k16Mixed), four);
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_TRUE(fp16->autocast.enabled);
  EXPECT_EQ(fp16->autocast.device, torch::kCUDA);
  EXPECT_EQ(fp16->autocast.dtype, torch::kHalf);
  EXPECT_TRUE(fp16->autocast.loss_scaling);
  auto bf16 = PlanDevices(Request("cuda", Precision::kBf16Mixed, true, 2), four);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->autocast.device, torch::kCUDA);
  EXPECT_EQ(bf16->autocast.dtype, torch::kBFloat16);
  EXPECT_FALSE(bf16->autocast.loss_scaling);
  EXPECT_FALSE(PlanDevices(Request("gpu", Precision::k32True), four)->autocast.enabled);
  // cpu is still the CPU on a GPU machine, with CPU autocast.
  auto cpu = PlanDevices(Request("cpu", Precision::kBf16Mixed, true, 2), four);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->replicas, std::vector<torch::Device>(2, torch::Device(torch::kCPU)));
  EXPECT_EQ(cpu->autocast.device, torch::kCPU);
}

// A replica's code sees the loop state the trainer set on the source as of the last Bind, and
// its own device as self.device (made on the CPU here, from a source that says another device:
// a CPU build cannot move a module's parameters to any other device).
TEST(ModuleReplica, LoopStateFollowsTheSourceAtEachBind_DeviceIsTheReplicas) {
  torch::jit::Module m("Looped");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::ones({1}), false);
  m.register_attribute("current_epoch", c10::IntType::get(), int64_t{0});
  m.register_attribute("global_step", c10::IntType::get(), int64_t{0});
  m.register_attribute("device", c10::DeviceObjType::get(), c10::Device(torch::kCPU));
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum() + self.current_epoch * 100 + self.global_step
)");
  absl::StatusOr<LightningModule> source = LightningModule::Wrap(m, "looped");
  ASSERT_TRUE(source.ok()) << source.status();
  auto replica = ModuleReplica::Make(&*source, torch::kCPU);
  ASSERT_TRUE(replica.ok()) << replica.status();
  const c10::IValue batch = c10::ivalue::Tuple::create({torch::ones({2}), torch::ones({2})});
  source->SetLoopState(3, 7);
  ASSERT_TRUE((*replica)->Bind().ok());
  EXPECT_EQ((*replica)->module().TrainingStep(batch, 0)->item<float>(), 2 + 300 + 7);
  source->SetLoopState(4, 9);
  EXPECT_EQ((*replica)->module().TrainingStep(batch, 1)->item<float>(), 2 + 300 + 7)
      << "until the next Bind, the replica keeps what it was bound with";
  ASSERT_TRUE((*replica)->Bind().ok());
  EXPECT_EQ((*replica)->module().TrainingStep(batch, 2)->item<float>(), 2 + 400 + 9);

  const torch::Device elsewhere = NonCpuDevice();
  source->SetDevice(elsewhere);
  auto made = ModuleReplica::Make(&*source, torch::kCPU);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->module().module().attr("device").toDevice(), torch::Device(torch::kCPU));
  EXPECT_EQ(source->module().attr("device").toDevice(), elsewhere);
}

// dp's CUDA replicas as torch.nn.DataParallel's replicate: run here on the CPU (a copy on the
// same device), which takes the same differentiable-copy path a cuda:i replica takes.
TEST(ModuleReplica, BackwardThroughTheReplica_GradientsLandOnTheSourceParameters) {
  const auto [x, y] = SyntheticBatch(16, 5);
  const c10::IValue batch = c10::ivalue::Tuple::create({x, y});
  auto direct = BuiltinModel("mlp", 7);
  auto source = BuiltinModel("mlp", 7);
  ASSERT_TRUE(direct.ok() && source.ok());
  auto loss = direct->TrainingStep(batch, 0);
  ASSERT_TRUE(loss.ok());
  loss->backward();

  auto replica = ModuleReplica::Make(&*source, torch::kCPU);
  ASSERT_TRUE(replica.ok()) << replica.status();
  ASSERT_TRUE((*replica)->Bind().ok());
  const auto source_params = source->Parameters();
  const auto replica_params = (*replica)->module().Parameters();
  ASSERT_EQ(source_params.size(), replica_params.size());
  EXPECT_FALSE(replica_params[0].is_same(source_params[0])) << "a copy, not the same tensor";
  auto replica_loss = (*replica)->module().TrainingStep(batch, 0);
  ASSERT_TRUE(replica_loss.ok()) << replica_loss.status();
  EXPECT_FLOAT_EQ(replica_loss->item<float>(), loss->item<float>());
  replica_loss->backward();
  const auto direct_params = direct->Parameters();
  for (size_t i = 0; i < source_params.size(); ++i) {
    ASSERT_TRUE(source_params[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(source_params[i].grad(), direct_params[i].grad(), 1e-6, 1e-7))
        << "parameter " << i;
  }
  // After an optimizer step on the source, Bind brings the new values to the replica.
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : source_params) p.add_(1.0);
  }
  ASSERT_TRUE((*replica)->Bind().ok());
  EXPECT_TRUE(torch::equal((*replica)->module().Parameters()[0], source_params[0]));
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

StrategyOptions DpOnTwoReplicas() {
  StrategyOptions dp;
  dp.name = "dp";
  dp.devices = 2;
  return dp;
}

// dp's reduce as Lightning's DataParallelStrategy.reduce: every tensor of a collection becomes
// its mean (integers averaged in float and cast back), other values pass through.
TEST(DataParallel, ReduceIsTheMeanOfEveryTensor_OtherValuesPassThrough) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("loss", torch::tensor({1.0f, 2.0f}));
  d.insert("count", torch::tensor({3, 4}, torch::kInt64));
  d.insert("name", std::string("replicas"));
  d.insert("pair", c10::ivalue::Tuple::create({torch::tensor({2.0, 5.0}, torch::kFloat64), 7}));
  const c10::impl::GenericDict r = DataParallelStrategy::ReduceCollection(d).toGenericDict();
  EXPECT_EQ(r.at("loss").toTensor().dim(), 0);
  EXPECT_EQ(r.at("loss").toTensor().item<float>(), 1.5f);
  EXPECT_EQ(r.at("count").toTensor().scalar_type(), torch::kInt64);
  EXPECT_EQ(r.at("count").toTensor().item<int64_t>(), 3);  // 3.5 cast back
  EXPECT_EQ(r.at("name").toStringRef(), "replicas");
  const auto& pair = r.at("pair").toTupleRef().elements();
  EXPECT_EQ(pair[0].toTensor().item<double>(), 3.5);
  EXPECT_EQ(pair[1].toInt(), 7);

  // Strategy::Reduce on one tensor under dp: its mean.
  auto a = Accelerator::Make("cpu", Precision::k32True, DpOnTwoReplicas(), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  torch::Tensor t = torch::tensor({1.0f, 2.0f, 6.0f});
  ASSERT_TRUE((*a)->Reduce(t, v1::REDUCE_OP_SUM).ok());
  EXPECT_EQ(t.item<float>(), 3.0f);
}

// Under dp the module's *_step_end receives the replicas' gathered outputs (one value per
// replica for a one-element output, concatenated otherwise), as in Lightning; without one, dp
// reduces them to their means; predict's outputs stay gathered.
TEST(DataParallel, StepEndSeesTheGatheredOutputs_ElseTheMeans) {
  auto model = BuiltinModel("mlp", 3);
  ASSERT_TRUE(model.ok());
  model->module().define(R"(
def training_step_end(self, loss: Tensor) -> Dict[str, Tensor]:
    return {"loss": loss.mean(), "replicas": torch.tensor(float(loss.numel()))}

def test_step_end(self, out: Dict[str, Tensor]) -> Dict[str, Tensor]:
    return {"acc": out["acc"], "replicas": torch.tensor(float(out["acc"].numel()))}
)");
  auto a = Accelerator::Make("cpu", Precision::k32True, DpOnTwoReplicas(), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Setup(std::move(*model), {}, {}).ok());
  const auto [x, y] = SyntheticBatch(10, 1);
  const c10::IValue batch = c10::ivalue::Tuple::create({x, y});
  auto loss = (*a)->TrainingStep(batch, 0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->dim(), 0);
  const auto extras = (*a)->model().TakeTrainingExtras();
  EXPECT_EQ(extras.at("replicas"), 2.0);

  // test_step_end: the per-replica accuracies, untouched by dp.
  auto tested = (*a)->TestStep(batch, 0);
  ASSERT_TRUE(tested.ok()) << tested.status();
  EXPECT_EQ(tested->at("replicas").item<float>(), 2.0f);
  EXPECT_EQ(tested->at("acc").numel(), 2);
  // No validation_step_end: every output is reduced to its mean over the replicas.
  auto validated = (*a)->ValidationStep(batch, 0);
  ASSERT_TRUE(validated.ok()) << validated.status();
  EXPECT_EQ(validated->at("acc").dim(), 0);
  EXPECT_NEAR(validated->at("acc").item<float>(), tested->at("acc").mean().item<float>(), 1e-6);
  // predict: gathered, every row.
  auto predicted = (*a)->PredictStep(batch, 0);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_EQ(predicted->at("logits").size(0), 10);
}

// The catalog (common/plugin_catalog.h) names dtrain's own plugins and says what each is; the
// worker attaches a factory to each one this build runs, with the catalog's traits, and refuses
// the others with the catalog's message.
TEST(PluginCatalog, EveryCatalogEntryHasAWorkerFactory_WithItsTraits) {
  const PluginRegistry& registry = PluginRegistry::Global();
  for (const PluginCatalogEntry& e : PluginCatalog("strategy")) {
    absl::StatusOr<PluginRegistry::StrategyEntry> found = ResolveStrategy(e.name);
    if (!e.refusal.empty()) {
      EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition) << e.name;
      EXPECT_THAT(std::string(found.status().message()), HasSubstr(e.refusal)) << e.name;
      continue;
    }
    ASSERT_TRUE(found.ok()) << e.name << ": " << found.status();
    EXPECT_EQ(found->info.name, e.name);
    EXPECT_EQ(found->traits.distributed, e.traits.distributed) << e.name;
    EXPECT_EQ(found->traits.spawns_per_device, e.traits.spawns_per_device) << e.name;
    EXPECT_EQ(found->traits.data_parallel, e.traits.data_parallel) << e.name;
    for (const std::string& alias : e.aliases) {
      EXPECT_EQ(ResolveStrategy(alias)->info.name, e.name) << alias;
    }
  }
  for (const PluginCatalogEntry& e : PluginCatalog("precision")) {
    EXPECT_TRUE(registry.FindPrecision(e.name).ok()) << e.name;
    for (const std::string& alias : e.aliases) EXPECT_TRUE(ParsePrecision(alias).ok()) << alias;
  }
  for (const PluginCatalogEntry& e : PluginCatalog("accelerator")) {
    const absl::StatusCode code = ResolveAccelerator(e.name).status().code();
    if (!e.refusal.empty()) {
      EXPECT_EQ(code, absl::StatusCode::kFailedPrecondition) << e.name;
      continue;
    }
    EXPECT_TRUE(registry.FindAccelerator(e.name).ok()) << e.name;
    // gpu needs CUDA: refused as unavailable here, never as unknown.
    EXPECT_NE(code, absl::StatusCode::kInvalidArgument) << e.name;
  }
  for (const PluginCatalogEntry& e : PluginCatalog("checkpoint_io")) {
    EXPECT_TRUE(registry.FindCheckpointIO(e.name).ok()) << e.name;
  }
  // Nothing the registry holds of dtrain's own is missing from the catalog.
  for (const PluginInfo& p : registry.List()) {
    if (p.origin != "builtin") continue;
    EXPECT_NE(FindInCatalog(PluginKindName(p.kind), p.name), nullptr) << p.name;
  }
}

TEST(JobSettingNames, EveryNameTheSpecAcceptsIsKnownToTheWorker) {
  for (const std::string& name : SettingNames("trainer.gradient_clip_algorithm")) {
    EXPECT_TRUE(ParseClipAlgorithm(name).ok()) << name;
  }
  for (const std::string& name : SettingNames("optimizer.name")) {
    OptimizerConfig config;
    config.name = name;
    EXPECT_TRUE(MakeOptimizer({torch::zeros({1}, torch::requires_grad())}, config).ok()) << name;
  }
  for (const std::string& name : SettingNames("lr_scheduler.name")) {
    SchedulerConfig config;
    config.name = name;
    config.total_steps = 10;
    EXPECT_TRUE(LrSchedule::Make(config, 0.1).ok()) << name;
  }
  for (const std::string& name : SettingNames("model.builtin")) {
    EXPECT_TRUE(BuiltinModel(name, 1).ok()) << name;
  }
}

}  // namespace worker_accelerator_test
}  // namespace dtrain

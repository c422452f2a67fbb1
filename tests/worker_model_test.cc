// The worker's model side: tensor conversion, the model zoo, the threads model code runs on,
// batch trees and datasets (users' LightningModules: lightning_module_test.cc; torch.save files
// as data: torch_save_file_test.cc; optimizers, schedules and checkpoints:
// worker_training_state_test.cc).

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>
#include <yaml-cpp/yaml.h>

#include <limits>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "tests/reference_data.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/collectives/collective_backend.h"
#include "worker/collectives/gloo_collective_backend.h"
#include "worker/collectives/shared_memory_collective_backend.h"
#include "worker/data/dataset.h"
#include "worker/data/idx_file.h"
#include "worker/model/batch_tree.h"
#include "worker/model/current_device.h"
#include "worker/model/lightning_module.h"
#include "worker/model/lr_schedulers.h"
#include "worker/model/model_thread_scope.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/model/script_execution.h"
#include "worker/model/tensor_convert.h"
#include "worker/model/torch_save_file.h"
#include "worker/precision/precision.h"
#include "worker/runtime/accelerator.h"
#include "worker/runtime/gradient_clipping.h"
#include "worker/strategies/gradient_sync.h"
#include "worker/strategies/sharded_optimizer.h"
namespace dtrain {
namespace worker_model_test {

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

TEST(TensorConvert, ReportedScalar_IsTheFloat64ConversionsValue_ForEveryDType) {
  // Values that a careless read would change: 0.1 in float32 (not 0.1 as a double), a large
  // int64 that rounds on the way to double, NaN, the reduced-precision float types, a bool, and
  // a complex value (its real part, as the conversion gives).
  const std::vector<torch::Tensor> ones = {
      torch::tensor(0.1f),
      torch::tensor(int64_t{(1LL << 53) + 1}),
      torch::tensor(std::numeric_limits<float>::quiet_NaN()),
      torch::tensor(1.0 / 3.0, torch::kFloat64),
      torch::tensor(0.3f).to(torch::kBFloat16),
      torch::tensor(0.3f).to(torch::kHalf),
      torch::tensor(true),
      torch::tensor({2.5f}),  // one element, one dimension
      torch::complex(torch::tensor(1.25f), torch::tensor(-4.0f)),
  };
  for (const torch::Tensor& one : ones) {
    const double want = one.to(torch::kFloat64).item<double>();
    const double got = ReportedScalar(one);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << one.scalar_type();
    } else {
      EXPECT_EQ(got, want) << one.scalar_type();
    }
  }
  EXPECT_EQ(ReportedScalar(torch::tensor(0.1f)), static_cast<double>(0.1f));
  EXPECT_NE(ReportedScalar(torch::tensor(0.1f)), 0.1);
}

TEST(TensorConvert, BadInput_InvalidArgument) {
  HostTensor short_data = HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {3}, {1.0f});
  EXPECT_EQ(ToTorch(short_data).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromTorch(torch::zeros({2}, torch::kComplexFloat)).status().code(),
            absl::StatusCode::kInvalidArgument);
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

std::string TempPath(const std::string& name) { return testing::TestTempPath(name); }

// A stand-in for CUDA's per-thread current device: a guard for PrivateUse1 that keeps the
// current index per thread, as cudaSetDevice does. CUDA's guard is the same interface.
thread_local c10::DeviceIndex stand_in_current = 0;
struct StandInDeviceGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return {c10::DeviceType::PrivateUse1, stand_in_current};
  }
  void setDevice(c10::Device d) const override { stand_in_current = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { stand_in_current = d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 4; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, StandInDeviceGuard);

// Lightning's set_device: a rank's thread works on its own device for the scope, other threads
// keep theirs, and the previous device comes back after; the CPU sets nothing; a device this
// libtorch has no guard for is an error, not a crash.
TEST(CurrentDevice, ScopeMakesTheRanksDeviceCurrentOnThisThreadOnly_ThenRestoresIt) {
  stand_in_current = 1;
  {
    const CurrentDeviceScope scope(torch::Device(c10::DeviceType::PrivateUse1, 3));
    ASSERT_TRUE(scope.status().ok()) << scope.status();
    EXPECT_EQ(stand_in_current, 3);
    c10::DeviceIndex seen_elsewhere = -1;
    std::thread([&] { seen_elsewhere = stand_in_current; }).join();
    EXPECT_EQ(seen_elsewhere, 0) << "another thread's device changed";
  }
  EXPECT_EQ(stand_in_current, 1);
  {
    const CurrentDeviceScope cpu(torch::Device(torch::kCPU));
    EXPECT_TRUE(cpu.status().ok());
    EXPECT_EQ(stand_in_current, 1);
  }
  const CurrentDeviceScope unsupported(torch::Device(torch::kXLA, 0));
  EXPECT_EQ(unsupported.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unsupported.status().message()), HasSubstr("xla:0"));
}

// Whether a method's executor built its optimized plan (which, once built, every later call
// uses, scope or not).
bool ExecutorOptimized(LightningModule& model, const std::string& method) {
  return torch::jit::toGraphFunction(model.module().get_method(method).function())
      .get_executor()
      .isOptimized();
}

// The switch is this thread's, for the scope's life (nested scopes included), and only the CPU
// takes it.
TEST(ScriptExecution, CpuScopeTurnsOptimizationOffOnThisThreadOnly_ThenRestoresIt) {
  ASSERT_TRUE(torch::jit::getGraphExecutorOptimize());
  {
    const ScriptExecutionScope scope(torch::Device(torch::kCPU));
    EXPECT_FALSE(torch::jit::getGraphExecutorOptimize());
    bool seen_elsewhere = false;
    std::thread([&] { seen_elsewhere = torch::jit::getGraphExecutorOptimize(); }).join();
    EXPECT_TRUE(seen_elsewhere) << "another thread's setting changed";
    {
      const ScriptExecutionScope inner(torch::Device(torch::kCPU));
      EXPECT_FALSE(torch::jit::getGraphExecutorOptimize());
    }
    EXPECT_FALSE(torch::jit::getGraphExecutorOptimize()) << "an inner scope ended the outer one";
    {
      const ScriptExecutionScope other(torch::Device(c10::DeviceType::PrivateUse1, 3));
      EXPECT_FALSE(torch::jit::getGraphExecutorOptimize()) << "a device scope turned it back on";
    }
  }
  EXPECT_TRUE(torch::jit::getGraphExecutorOptimize());
  {
    const ScriptExecutionScope other(torch::Device(c10::DeviceType::PrivateUse1, 3));
    EXPECT_TRUE(torch::jit::getGraphExecutorOptimize()) << "only the CPU runs unoptimized";
  }
}

// Two CNNs from one seed, one stepped only outside any scope (its executor builds the optimized
// plan after its profiling run), one only inside: the second never builds that plan, and its
// loss and gradients are the first's.
TEST(ScriptExecution, ScopedModelNeverOptimizes_SameLossAndGradientsAsTheOptimizedPlan) {
  absl::StatusOr<LightningModule> optimized = BuiltinModel("cnn", 1);
  absl::StatusOr<LightningModule> plain = BuiltinModel("cnn", 1);
  ASSERT_TRUE(optimized.ok() && plain.ok());
  torch::manual_seed(3);
  const c10::IValue batch = c10::ivalue::Tuple::create(
      {torch::randn({16, 784}), torch::randint(0, 10, {16}, torch::kLong)});
  auto step = [&](LightningModule& model) -> std::pair<double, std::vector<torch::Tensor>> {
    model.Train(true);
    for (torch::Tensor p : model.Parameters()) p.mutable_grad() = torch::Tensor();
    absl::StatusOr<torch::Tensor> loss = model.TrainingStep(batch, 0);
    EXPECT_TRUE(loss.ok()) << loss.status();
    loss->backward();
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : model.Parameters()) grads.push_back(p.grad().clone());
    return {loss->item<double>(), grads};
  };
  std::pair<double, std::vector<torch::Tensor>> want, got;
  for (int i = 0; i < 4; ++i) want = step(*optimized);
  {
    const ScriptExecutionScope scope(torch::Device(torch::kCPU));
    for (int i = 0; i < 4; ++i) got = step(*plain);
  }
  EXPECT_TRUE(ExecutorOptimized(*optimized, "training_step"))
      << "the comparison needs the optimized plan";
  EXPECT_FALSE(ExecutorOptimized(*plain, "training_step"));
  EXPECT_NEAR(got.first, want.first, 1e-6 * std::abs(want.first));
  ASSERT_EQ(got.second.size(), want.second.size());
  for (size_t i = 0; i < got.second.size(); ++i) {
    EXPECT_GT(got.second[i].abs().sum().item<double>(), 0) << "parameter " << i << ": no gradient";
    EXPECT_TRUE(torch::allclose(got.second[i], want.second[i], 1e-4, 1e-6))
        << "parameter " << i << ": max difference "
        << (got.second[i] - want.second[i]).abs().max().item<double>();
  }
}

// The one scope a rank's model code runs in sets both parts for its device and restores both:
// the CPU runs TorchScript unoptimized and makes no device current; another device is made
// current and keeps the executor's default; a device without a guard reports its error.
TEST(ModelThreadScope, SetsTheDeviceAndTheExecutionModeTogether_ThenRestoresBoth) {
  stand_in_current = 1;
  ASSERT_TRUE(torch::jit::getGraphExecutorOptimize());
  {
    const ModelThreadScope cpu(torch::Device(torch::kCPU));
    EXPECT_TRUE(cpu.status().ok()) << cpu.status();
    EXPECT_FALSE(torch::jit::getGraphExecutorOptimize());
    EXPECT_EQ(stand_in_current, 1);
  }
  EXPECT_TRUE(torch::jit::getGraphExecutorOptimize());
  {
    const ModelThreadScope other(torch::Device(c10::DeviceType::PrivateUse1, 2));
    ASSERT_TRUE(other.status().ok()) << other.status();
    EXPECT_EQ(stand_in_current, 2);
    EXPECT_TRUE(torch::jit::getGraphExecutorOptimize());
  }
  EXPECT_EQ(stand_in_current, 1);
  const ModelThreadScope unsupported(torch::Device(torch::kXLA, 0));
  EXPECT_EQ(unsupported.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unsupported.status().message()), HasSubstr("xla:0"));
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

// A dry run's report of a batch: nesting, dtypes by Python's names and shapes, dict keys in
// order, other leaves by kind.
TEST(BatchTree, DescribeBatch_NestingDtypesShapes) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("image", torch::zeros({8, 3, 2, 2}, torch::kUInt8));
  dict.insert("label", torch::zeros({8}, torch::kInt64));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::zeros({2}, torch::kFloat16));
  list.push_back(c10::IValue(int64_t{7}));
  const c10::IValue batch = c10::ivalue::Tuple::create({torch::zeros({32, 1, 28, 28}), dict, list});
  EXPECT_EQ(DescribeBatch(batch),
            "tuple(float32[32, 1, 28, 28], dict(image: uint8[8, 3, 2, 2], label: int64[8]), "
            "list(float16[2], Int))");
  EXPECT_EQ(DescribeBatch(torch::zeros({0}, torch::kFloat64)), "float64[0]");
}

// batch_to_device moves every tensor of a nested batch, to a device that is not the CPU
// (libtorch's lazy tensors here: the only other device a CPU build has), values unchanged;
// numbers and strings stay as they are, and a tensor already there is not copied.
TEST(BatchTree, MoveBatchToDevice_EveryTensorLandsOnTheDevice_OtherLeavesKept) {
  const torch::Device device = NonCpuDevice();
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("x", torch::arange(6, torch::kFloat32).view({2, 3}));
  dict.insert("name", std::string("batch-7"));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::tensor({4, 5}, torch::kInt64));
  list.push_back(int64_t{42});
  const torch::Tensor already = torch::ones({2}).to(device);
  const c10::IValue batch = c10::ivalue::Tuple::create({dict, list, already});
  const c10::IValue moved = MoveBatchToDevice(batch, device);
  const auto& items = moved.toTupleRef().elements();
  const torch::Tensor x = items[0].toGenericDict().at("x").toTensor();
  const torch::Tensor labels = items[1].toList().get(0).toTensor();
  EXPECT_EQ(x.device(), device);
  EXPECT_EQ(labels.device(), device);
  EXPECT_TRUE(torch::equal(x.cpu(), torch::arange(6, torch::kFloat32).view({2, 3})));
  EXPECT_TRUE(torch::equal(labels.cpu(), torch::tensor({4, 5}, torch::kInt64)));
  EXPECT_EQ(items[0].toGenericDict().at("name").toStringRef(), "batch-7");
  EXPECT_EQ(items[1].toList().get(1).toInt(), 42);
  EXPECT_TRUE(items[2].toTensor().is_same(already)) << "a tensor already there was copied";
  // And back: the CPU is a device like any other.
  const c10::IValue back = MoveBatchToDevice(moved, torch::kCPU);
  EXPECT_TRUE(back.toTupleRef().elements()[0].toGenericDict().at("x").toTensor().is_cpu());
  // A batch wholly there already is still rebuilt: the step's containers are its own.
  const c10::IValue again = MoveBatchToDevice(back, torch::kCPU);
  EXPECT_FALSE(again.is(back));
  EXPECT_TRUE(again.toTupleRef().elements()[2].toTensor().is_same(
      back.toTupleRef().elements()[2].toTensor()));
}

// VisitTensors walks depth first without rebuilding, and stops where its callback says.
TEST(BatchTree, VisitTensors_DepthFirstUntilTheCallbackStops) {
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::zeros({2}));
  list.push_back(int64_t{5});
  list.push_back(torch::zeros({3}));
  const c10::IValue batch =
      c10::ivalue::Tuple::create({torch::zeros({1}), list, torch::zeros({4})});
  std::vector<int64_t> seen;
  EXPECT_TRUE(VisitTensors(batch, [&](const at::Tensor& t) {
    seen.push_back(t.size(0));
    return true;
  }));
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4}));
  seen.clear();
  EXPECT_FALSE(VisitTensors(batch, [&](const at::Tensor& t) {
    seen.push_back(t.size(0));
    return t.size(0) < 2;
  }));
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(BatchSize(batch), 1);
  EXPECT_EQ(BatchSize(c10::IValue(int64_t{3})), 0) << "no tensor, no rows";
  EXPECT_EQ(BatchSize(torch::tensor(2.5)), 1) << "a 0-dim tensor is one sample";
}

// The real Fashion-MNIST files (Debian's dataset-fashion-mnist, installed by install-deps.sh).
TEST(Dataset, FashionMnist_SplitsShapesAndNormalization) {
  v1::DataConfig spec;
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
  // Normalized with the training set's statistics, bitwise as the ATen ops compute it from the
  // file's bytes (which take all 256 values here, so every value the table holds is checked).
  auto raw = ReadIdxGz(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_GE(raw->data.size(), 2000u * 784);
  const torch::Tensor bytes =
      torch::from_blob(raw->data.data(), {2000, 1, 28, 28}, torch::kUInt8).clone();
  EXPECT_EQ(std::get<0>(at::_unique(bytes)).numel(), 256);
  EXPECT_TRUE(torch::equal(x, (bytes.to(torch::kFloat) / 255.0 - 0.2860) / 0.3530));
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
  // Hostile headers (issue 38): dimensions whose product is beyond the bound (before, a product
  // could wrap to 0 and the worker aborted) are refused before anything is allocated; more values
  // than declared are refused without reading them all.
  const std::string overflow = TempPath("overflow.idx");
  std::ofstream(overflow, std::ios::binary)
      << std::string("\x00\x00\x08\x03\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00", 16);
  auto wrapped = ReadIdxGz(overflow);
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(wrapped.status().message()),
      HasSubstr("declares dimensions whose product is over 2147483648 values (2 of 3 read)"));
  const std::string longer = TempPath("longer.idx");
  std::ofstream(longer, std::ios::binary)
      << std::string("\x00\x00\x08\x01\x00\x00\x00\x02", 8) << std::string(1 << 20, 'x');
  auto extra = ReadIdxGz(longer);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(extra.status().message()), HasSubstr("should hold 2 values after its "
                                                               "header, has more"));
  // Within a bound of the caller's: a 1000 x 1000 header over a bound of 10^5 values.
  const std::string header("\x00\x00\x08\x02\x00\x00\x03\xe8\x00\x00\x03\xe8", 12);
  size_t at = 0;
  auto bounded = ReadIdx(
      [&](char* out, int64_t n) -> int64_t {
        const size_t take = std::min<size_t>(static_cast<size_t>(n), header.size() - at);
        std::memcpy(out, header.data() + at, take);
        at += take;
        return static_cast<int64_t>(take);
      },
      "bounded.idx", 100000);
  EXPECT_EQ(bounded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bounded.status().message()), HasSubstr("over 100000 values"));
}

// A checkpoint's scheduler state is a file's: a NaN, an infinity or 1e300 where torch writes an
// int is refused by name (a cast of it to int64 would be undefined), and an integral float, as
// Python may write one, still loads.
TEST(LrSchedulerState, NonFiniteOrHugeIntegers_InvalidArgumentNamingTheKey) {
  google::protobuf::RepeatedPtrField<v1::SchedulerRecipe> recipes;
  v1::SchedulerRecipe* step = recipes.Add();
  step->set_kind("StepLR");
  step->set_step_size(2);
  step->set_gamma(0.5);
  OptimizerConfig sgd;
  sgd.lr = 0.1;
  absl::StatusOr<std::unique_ptr<LrSchedulers>> schedulers = LrSchedulers::Make(recipes, sgd, {});
  ASSERT_TRUE(schedulers.ok()) << schedulers.status();
  const std::vector<c10::IValue> saved = (*schedulers)->StateDicts();
  ASSERT_EQ(saved.size(), 1u);
  auto with_last_epoch = [&](double value) {
    c10::impl::GenericDict state = saved[0].toGenericDict().copy();
    state.insert_or_assign(c10::IValue(std::string("last_epoch")), c10::IValue(value));
    return (*schedulers)->Load({c10::IValue(state)}, (*schedulers)->groups());
  };
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL, 1e300, 9223372036854775808.0}) {
    const absl::Status loaded = with_last_epoch(bad);
    EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(loaded.message()),
                HasSubstr("'last_epoch' is not a finite number within int64's range"))
        << bad;
  }
  EXPECT_TRUE(with_last_epoch(3.0).ok());
  EXPECT_TRUE(with_last_epoch(1e15).ok());
}

}  // namespace worker_model_test
}  // namespace dtrain

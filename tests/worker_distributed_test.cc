// Training across ranks: ddp and dp equal one process on the doubled batch, gradient
// accumulation, ZeRO-1, all_gather with gradients, and every collective backend (the
// coordinator's gRPC, Gloo, shared memory) held to the same semantics.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "tests/reference_data.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/collectives/collective_backend.h"
#include "worker/collectives/collective_plane.h"
#include "worker/collectives/gloo_collective_backend.h"
#include "worker/collectives/shared_memory_collective_backend.h"
#include "worker/data/dataset.h"
#include "worker/data/idx_file.h"
#include "worker/model/batch_tree.h"
#include "worker/model/lightning_module.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/model/tensor_convert.h"
#include "worker/precision/precision.h"
#include "worker/runtime/accelerator.h"
#include "worker/runtime/gradient_clipping.h"
#include "worker/runtime/registered_plugins.h"
#include "worker/strategies/gradient_sync.h"
#include "worker/strategies/sharded_optimizer.h"
#include "worker/strategies/strategy.h"
namespace dtrain {
namespace worker_distributed_test {

using ::testing::HasSubstr;

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
  // buckets for 4 parameters. The first started from the autograd hooks, during backward; the
  // last is all-reduced by the caller when backward ends.
  EXPECT_EQ(buckets[0], 2u);
  EXPECT_EQ(overlapped[0], 1u);
  EXPECT_EQ(overlapped[1], 1u);

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
        GradientSync sync(&backend, model->Parameters(), StrategyOptions().bucket_bytes);
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
          GradientSync sync(&backend, model->Parameters(), StrategyOptions().bucket_bytes);
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

// all_gather(sync_grads=True): rank k's loss is sum_j (k+1)(j+1) * gathered[j], so the gradient
// reaching rank r's input is the sum over k of (k+1)(r+1) = 3(r+1) for two ranks.
TEST(Strategy, AllGatherWithSyncGrads_GradientsFlowBackAcrossRanks) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<torch::Tensor> grads(2), gathered(2);
  auto statuses = testing::RunRanks(
      coordinator->address(), "gather-grad", 2, [&](ProcessGroup& pg) -> absl::Status {
        StrategyOptions options;
        options.name = "ddp";
        auto strategy = MakeStrategy(options, std::make_unique<GrpcCollectiveBackend>(&pg));
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

// The world of one (single_device, dp) answers on the caller's device too.
TEST(LocalBackend, EveryCollectiveOnANonCpuDevice_AnswersOnThatDevice) {
  const torch::Device device = NonCpuDevice();
  LocalCollectiveBackend b;
  torch::Tensor t = torch::tensor({1.5f, -2.0f}).to(device);
  ASSERT_TRUE(b.AllReduce(t, v1::REDUCE_OP_MEAN).ok());
  ASSERT_TRUE(b.Broadcast(t, 0).ok());
  ASSERT_TRUE(b.Reduce(t, 0, v1::REDUCE_OP_SUM).ok());
  EXPECT_EQ(t.device(), device);
  EXPECT_TRUE(torch::equal(t.cpu(), torch::tensor({1.5f, -2.0f})));
  auto gathered = b.AllGather(t);
  ASSERT_TRUE(gathered.ok());
  ASSERT_EQ(gathered->size(), 1u);
  EXPECT_EQ((*gathered)[0].device(), device);
}

// all_gather(sync_grads) on a device that is not the CPU: the gathered tensor and the gradient
// autograd gets back are on the caller's device.
TEST(Strategy, AllGatherOnANonCpuDevice_ResultAndGradientStayOnIt) {
  const torch::Device device = NonCpuDevice();
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<std::string> devices(4);
  std::vector<torch::Tensor> grads(2);
  auto statuses = testing::RunRanks(
      coordinator->address(), "gather-device", 2, [&](ProcessGroup& pg) -> absl::Status {
        StrategyOptions options;
        options.name = "ddp";
        DTRAIN_ASSIGN_OR_RETURN(
            auto strategy, MakeStrategy(options, std::make_unique<GrpcCollectiveBackend>(&pg)));
        const int r = pg.rank();
        torch::Tensor x = torch::full({3}, static_cast<float>(r + 10)).to(device).requires_grad_();
        DTRAIN_ASSIGN_OR_RETURN(torch::Tensor all, strategy->AllGather(x, /*sync_grads=*/true));
        devices[2 * r] = all.device().str();
        (all * (r + 1)).sum().backward();
        devices[2 * r + 1] = x.grad().device().str();
        grads[r] = x.grad().cpu();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (const std::string& d : devices) EXPECT_EQ(d, device.str());
  // Every rank's loss weighs every slice by (r + 1): each gradient is 1 + 2.
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(torch::equal(grads[r], torch::full({3}, 3.0f))) << grads[r];
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

TEST_P(BackendConformance, EveryCollectiveOnANonCpuDevice_AnswersOnThatDevice) {
  const torch::Device device = NonCpuDevice();
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    const int r = b.rank();
    std::vector<std::string> wrong;
    auto check = [&](const torch::Tensor& got, const torch::Tensor& expected,
                     const std::string& op) {
      if (got.device() != device) {
        wrong.push_back(absl::StrCat(op, " answered on ", got.device().str()));
      } else if (!torch::equal(got.cpu(), expected)) {
        wrong.push_back(absl::StrCat(op, " computed a wrong value"));
      }
    };
    torch::Tensor sum = (torch::tensor({1.5f, -2.0f}) * (r + 1)).to(device);
    DTRAIN_RETURN_IF_ERROR(b.AllReduce(sum, v1::REDUCE_OP_SUM));
    check(sum, torch::tensor({4.5f, -6.0f}), "all_reduce sum");
    torch::Tensor mean = (torch::tensor({2.0f, 4.0f}) * (r + 1)).to(device);
    DTRAIN_RETURN_IF_ERROR(b.AllReduce(mean, v1::REDUCE_OP_MEAN));
    check(mean, torch::tensor({3.0f, 6.0f}), "all_reduce mean");
    torch::Tensor from_one = torch::full({3}, 10.0f * r).to(device);
    DTRAIN_RETURN_IF_ERROR(b.Broadcast(from_one, 1));
    check(from_one, torch::full({3}, 10.0f), "broadcast");
    DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> gathered,
                            b.AllGather(torch::full({2}, static_cast<float>(r)).to(device)));
    if (gathered.size() != 2) return absl::InternalError("all_gather: not one part per rank");
    for (int i = 0; i < 2; ++i) {
      check(gathered[i], torch::full({2}, static_cast<float>(i)), absl::StrCat("all_gather ", i));
    }
    torch::Tensor reduced = torch::tensor({r + 1.0f}).to(device);
    DTRAIN_RETURN_IF_ERROR(b.Reduce(reduced, 1, v1::REDUCE_OP_SUM));
    check(reduced, torch::tensor({r == 1 ? 3.0f : 1.0f}), "reduce");
    if (!wrong.empty()) {
      return absl::InternalError(absl::StrCat("rank ", r, ": ", absl::StrJoin(wrong, "; ")));
    }
    return absl::OkStatus();
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

// Memory from AllocateForAllReduce reduces as ordinary memory does: the whole buffer and a
// slice at an offset, sum, mean and max, float32 and float64, on 3 ranks so that partitions are
// uneven. Random values make the float sums rounding-sensitive: on shm (where that memory is
// shared and nothing is copied) the result is bitwise the slot path's and the rank-order sum's.
TEST_P(BackendConformance, MemoryForAllReduce_ReducesAsOrdinaryMemory) {
  const bool shm = GetParam() == "shm";
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int64_t n = 100'003;
        const int r = b.rank();
        auto fail = [&](const std::string& what) {
          return absl::InternalError(absl::StrCat("rank ", r, ": ", what));
        };
        for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64}) {
          absl::StatusOr<torch::Tensor> buffer = b.AllocateForAllReduce(n, dtype);
          if (!buffer.ok()) return buffer.status();
          if (buffer->numel() != n || buffer->scalar_type() != dtype ||
              buffer->abs().max().item<double>() != 0) {
            return fail("not n zeros of the dtype asked for");
          }
          std::vector<torch::Tensor> inputs;
          for (int k = 0; k < 3; ++k) {
            // A generator of its own: the ranks are threads sharing torch's default one.
            at::Generator generator = at::detail::createCPUGenerator(7 + k);
            inputs.push_back(torch::randn({n}, generator, torch::TensorOptions().dtype(dtype)));
          }
          buffer->copy_(inputs[r]);
          torch::Tensor plain = inputs[r].clone();
          if (auto s = b.AllReduce(*buffer, v1::REDUCE_OP_MEAN); !s.ok()) return s;
          if (auto s = b.AllReduce(plain, v1::REDUCE_OP_MEAN); !s.ok()) return s;
          const torch::Tensor mean = (inputs[0] + inputs[1] + inputs[2]) / 3;
          if (shm ? !(torch::equal(*buffer, plain) && torch::equal(*buffer, mean))
                  : !torch::allclose(*buffer, mean, 1e-5, 1e-6)) {
            return fail(absl::StrCat("mean of ", c10::toString(dtype), " differs: shared vs plain ",
                                     (*buffer - plain).abs().max().item<double>(), ", vs the mean ",
                                     (*buffer - mean).abs().max().item<double>()));
          }
          // A slice at an offset (a bucket's later parameter), then a max and a sum over it.
          const torch::Tensor before = buffer->slice(0, 0, 5).clone();
          torch::Tensor slice = buffer->slice(0, 5, 5 + 777);
          slice.copy_(inputs[r].slice(0, 0, 777) * (r + 1));
          if (auto s = b.AllReduce(slice, v1::REDUCE_OP_MAX); !s.ok()) return s;
          const torch::Tensor head = inputs[0].slice(0, 0, 777);
          const torch::Tensor max = torch::maximum(
              torch::maximum(head, inputs[1].slice(0, 0, 777) * 2), inputs[2].slice(0, 0, 777) * 3);
          if (!torch::equal(slice, max)) return fail("max over a slice differs");
          if (!torch::equal(buffer->slice(0, 0, 5), before)) {
            return fail("the reduction of a slice wrote outside it");
          }
          if (auto s = b.AllReduce(*buffer, v1::REDUCE_OP_SUM); !s.ok()) return s;
          if (!torch::allclose(buffer->slice(0, 0, 5), before * 3, 1e-5, 1e-6)) {
            return fail("sum differs");
          }
        }
        return absl::OkStatus();
      },
      /*world=*/3);
}

// Gradients live in their buckets: backward accumulates into the bucket, the mean lands there,
// and no gradient tensor is replaced. A gradient outlives the GradientSync and the plane.
TEST_P(BackendConformance, GradientsLiveInTheirBuckets_AndOutliveThePlane) {
  std::vector<torch::Tensor> kept(2);
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("mlp", 100);
    if (!model.ok()) return model.status();
    std::vector<torch::Tensor> p = model->Parameters();
    auto sync = std::make_unique<GradientSync>(&b, p, /*bucket_bytes=*/256 * 1024);
    std::vector<void*> where;
    for (const torch::Tensor& t : p) {
      if (!t.grad().defined() || t.grad().abs().max().item<float>() != 0) {
        return absl::InternalError("a gradient is not set to zeros in its bucket");
      }
      where.push_back(t.grad().data_ptr());
    }
    for (int step = 0; step < 3; ++step) {
      for (const torch::Tensor& t : p) t.grad().zero_();
      sync->ExpectSync();
      // Gradient of parameter k on rank r: (r + 1) * (k + 1) * (step + 1); mean over 2 ranks:
      // 1.5 * (k + 1) * (step + 1).
      torch::Tensor loss = torch::zeros({});
      for (size_t k = 0; k < p.size(); ++k) {
        loss = loss + p[k].sum() * ((b.rank() + 1.0) * static_cast<double>(k + 1));
      }
      (loss * (step + 1)).backward();
      if (auto s = sync->AverageGradients(); !s.ok()) return s;
      for (size_t k = 0; k < p.size(); ++k) {
        if (p[k].grad().data_ptr() != where[k]) {
          return absl::InternalError(absl::StrCat("parameter ", k, "'s gradient moved"));
        }
        if (!torch::equal(p[k].grad(), torch::full_like(p[k], 1.5f * (k + 1) * (step + 1)))) {
          return absl::InternalError(
              absl::StrCat("parameter ", k, ": not the mean at step ", step));
        }
      }
    }
    sync.reset();
    kept[b.rank()] = p[0].grad();
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(kept[r].defined());
    EXPECT_TRUE(torch::equal(kept[r], torch::full_like(kept[r], 4.5f))) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance, ::testing::Values("grpc", "gloo", "shm"));

// Shared memory is loud on misuse: ranks whose calls differ all get FAILED_PRECONDITION
// naming both calls, later calls fail at once, and a rank that never comes is named at the
// deadline.
// A worker handed a Setup that did not pass the coordinator refuses nccl as the spec does, and
// lists the planes for a name it does not know; neither touches the group.
TEST(CollectivePlane, NcclRefusedByName_UnknownNamesListThePlanes) {
  auto nccl = ConnectCollectivePlane("nccl", "", nullptr, absl::Seconds(1), absl::Seconds(1));
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(nccl.status().message()),
              HasSubstr("'nccl' is not built: dtrain has no NCCL plane"));
  auto mpi = ConnectCollectivePlane("mpi", "", nullptr, absl::Seconds(1), absl::Seconds(1));
  EXPECT_EQ(mpi.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mpi.status().message()), HasSubstr("use auto, grpc, gloo or shm"));
}

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

  // One rank reduces its shared buffer, the other ordinary memory of the same size: not the
  // same collective, and said so.
  statuses = testing::RunRanks(address, "shm-where", 2, [&](ProcessGroup& pg) -> absl::Status {
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(30));
    if (!backend.ok()) return backend.status();
    absl::StatusOr<torch::Tensor> shared = (*backend)->AllocateForAllReduce(64, torch::kFloat32);
    if (!shared.ok()) return shared.status();
    torch::Tensor plain = torch::ones({64});
    mismatch[pg.rank()] =
        (*backend)->AllReduce(pg.rank() == 0 ? *shared : plain, v1::REDUCE_OP_SUM);
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mismatch[r].code(), absl::StatusCode::kFailedPrecondition) << mismatch[r];
    EXPECT_THAT(std::string(mismatch[r].message()),
                HasSubstr("all_reduce of 64 Float REDUCE_OP_SUM in shared buffer #0 at element 0"));
  }

  absl::Status waited;
  absl::Duration took;
  absl::Notification answered;
  statuses = testing::RunRanks(address, "shm-missing", 2, [&](ProcessGroup& pg) -> absl::Status {
    // 4 s: the timeout also bounds the planes' set-up, which a loaded machine slows.
    auto backend = MakeBackend("shm", address, &pg, absl::Seconds(4));
    if (!backend.ok()) return backend.status();
    if (pg.rank() == 1) {
      // Alive (heartbeating) but never calls, until rank 0 has its answer.
      answered.WaitForNotificationWithTimeout(absl::Seconds(30));
      return absl::OkStatus();
    }
    torch::Tensor t = torch::ones({1000});
    const absl::Time start = absl::Now();
    waited = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
    took = absl::Now() - start;
    answered.Notify();
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("rank(s) 1 did not arrive within 4s"));
  EXPECT_GE(took, absl::Seconds(4));
  EXPECT_LT(took, absl::Seconds(10));
}

// Ranks of a cancelled step stop at their own next batch, so one may wait in a collective its
// peer (alive, heartbeating) never starts: neither the group's health nor a timeout of minutes
// would end that wait, the cancellation must. On each peer-to-peer plane, and for a collective
// shm hands to Gloo (int64); the plane is broken afterwards, loudly.
class InterruptedWait : public ::testing::TestWithParam<std::string> {};

TEST_P(InterruptedWait, ACancelledStepEndsTheWaitForAPeerThatNeverComes) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  const bool through_gloo = GetParam() == "shm-int64";
  absl::Status waited, later;
  absl::Duration took, later_took;
  absl::Notification done;
  auto statuses = testing::RunRanks(
      address, "interrupt-" + GetParam(), 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend =
            MakeBackend(through_gloo ? "shm" : GetParam(), address, &pg, absl::Minutes(5));
        if (!backend.ok()) return backend.status();
        if (pg.rank() == 1) {
          // Alive, but never calls until rank 0 is done: only the interruption can end its wait
          // (leaving would end it too, after 30 s, and fail the time check below).
          done.WaitForNotificationWithTimeout(absl::Seconds(30));
          return absl::OkStatus();
        }
        auto make = [&] {
          return through_gloo ? torch::ones({1000}, torch::kInt64) : torch::ones({1000});
        };
        torch::Tensor t = make();
        const absl::Time start = absl::Now();
        // The interruption comes 300 ms after the call began, while it waits for rank 1: the
        // delay is the scenario (a wait under way is ended), not settling. A call that ended
        // before it, or was not ended by it, fails the time checks below.
        std::thread canceller([&] {
          absl::SleepFor(absl::Milliseconds(300));
          (*backend)->Interrupt(absl::CancelledError("job j was cancelled"));
        });
        waited = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM);
        took = absl::Now() - start;
        canceller.join();
        (*backend)->ClearInterrupt();  // the next step begins
        torch::Tensor u = make();
        const absl::Time again = absl::Now();
        later = (*backend)->AllReduce(u, v1::REDUCE_OP_SUM);
        later_took = absl::Now() - again;
        done.Notify();
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("all_reduce on rank 0"));
  EXPECT_THAT(std::string(waited.message()), HasSubstr("job j was cancelled"));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(10));  // not the 30 s leave nor the 5 min timeout
  // The interrupted collective left the plane half-done: later calls fail at once.
  EXPECT_FALSE(later.ok());
  EXPECT_LT(later_took, absl::Seconds(5));
}

// Gloo's waits are sliced (to poll the interruption and the group's health): an operation that
// completes as a slice runs out is a success, never a false "timed out". Rank 1 arrives at
// about the slice length late, many times over.
TEST(GlooBackend, OperationsCompletingAtASliceBoundary_Succeed) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  auto statuses =
      testing::RunRanks(address, "gloo-slices", 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend("gloo", address, &pg, absl::Seconds(30));
        if (!backend.ok()) return backend.status();
        for (int i = 0; i < 150; ++i) {
          if (pg.rank() == 1) absl::SleepFor(absl::Microseconds(19000 + (i * 37) % 2000));
          torch::Tensor t = torch::full({16}, static_cast<float>(pg.rank() + 1));
          if (absl::Status s = (*backend)->AllReduce(t, v1::REDUCE_OP_SUM); !s.ok()) {
            return absl::Status(s.code(), absl::StrCat("operation ", i, ": ", s.message()));
          }
          if (!torch::equal(t, torch::full({16}, 3.0f))) {
            return absl::InternalError(absl::StrCat("operation ", i, ": wrong sum"));
          }
        }
        return absl::OkStatus();
      });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Planes, InterruptedWait, ::testing::Values("gloo", "shm", "shm-int64"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

}  // namespace worker_distributed_test
}  // namespace dtrain

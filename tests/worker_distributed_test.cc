// Training across ranks: ddp equals one process on the doubled batch, gradient accumulation
// (alone and under ddp), ZeRO-1 equals ddp, and all_gather with gradients, on the CPU and on a
// device that is not. The collective backends' semantics: worker_distributed_conformance_test.cc;
// their misuse and faults: worker_distributed_faults_test.cc.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/collectives/collective_backend.h"
#include "worker/model/lightning_module.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/runtime/accelerator.h"
#include "worker/runtime/registered_plugins.h"
#include "worker/strategies/gradient_sync.h"
#include "worker/strategies/sharded_optimizer.h"
#include "worker/strategies/strategy.h"

namespace dtrain {
namespace worker_distributed_test {

// Trains `model` for `steps` SGD steps; on step k, `rank` of `world` takes its slice of the
// global batch k. With `sync`, gradients are averaged across ranks after backward.
// With `accumulate` > 1, the rank's slice is split into that many micro-batches whose scaled
// losses accumulate gradients, synchronized only after the last (no sync while accumulating).
// `set_to_none`: each step starts with no gradients (as a dtrain step does) instead of zeroing
// them in place.
absl::Status TrainSlice(LightningModule& model, GradientSync* sync, int rank, int world,
                        int64_t global_batch, int steps, int accumulate = 1,
                        bool set_to_none = false) {
  auto optimizer = MakeOptimizer(model.Parameters(), {.name = "sgd", .lr = 0.1, .momentum = 0.9});
  if (!optimizer.ok()) return optimizer.status();
  const int64_t per_rank = global_batch / world;
  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = SyntheticBatch(global_batch, 1000 + step);
    if (set_to_none) {
      for (torch::Tensor& p : model.Parameters()) p.mutable_grad().reset();
    } else {
      (*optimizer)->zero_grad();
    }
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

// A step that starts with no gradients hands the buckets autograd's new ones: each is copied
// into its bucket, and after the average the parameter's gradient is its place in the bucket
// again (no copy out, no new memory), with the same result as gradients zeroed in place.
TEST(DataParallel, GradientsSetToNone_CopiedIntoBuckets_SameResultAndGradientsStayInThem) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  constexpr int kSteps = 6;
  constexpr int64_t kGlobalBatch = 32;
  std::vector<std::vector<torch::Tensor>> none(2), zeroed(2);
  std::vector<int> stayed(2, -1);
  auto statuses = testing::RunRanks(coordinator->address(), "ddp-none", 2, [&](ProcessGroup& pg) {
    GrpcCollectiveBackend backend(&pg);
    for (bool set_to_none : {true, false}) {
      auto model = BuiltinModel("mlp", 100);
      if (!model.ok()) return model.status();
      GradientSync sync(&backend, model->Parameters(), /*bucket_bytes=*/256 * 1024);
      std::vector<void*> places;
      for (const torch::Tensor& p : model->Parameters()) places.push_back(p.grad().data_ptr());
      DTRAIN_RETURN_IF_ERROR(
          TrainSlice(*model, &sync, pg.rank(), 2, kGlobalBatch, kSteps, 1, set_to_none));
      if (set_to_none) {
        int same = 0;
        for (size_t i = 0; i < places.size(); ++i) {
          same += model->Parameters()[i].grad().data_ptr() == places[i] ? 1 : 0;
        }
        stayed[pg.rank()] = same;
      }
      (set_to_none ? none : zeroed)[pg.rank()] = model->Parameters();
    }
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(stayed[r], 4) << "rank " << r << ": every gradient back in its bucket";
    for (size_t i = 0; i < none[r].size(); ++i) {
      EXPECT_TRUE(torch::equal(none[r][i], zeroed[r][i])) << "rank " << r << " parameter " << i;
    }
  }
  auto untrained = BuiltinModel("mlp", 100);
  EXPECT_GT((untrained->Parameters()[0] - none[0][0]).abs().max().item<double>(), 1e-3);
}

// A sparse gradient (an embedding's) set to none before backward reaches its bucket dense and
// is averaged; a frozen parameter in a bucket gets no gradient (the optimizer would step it).
TEST(DataParallel, SparseGradientAveragedDense_FrozenParameterLeftWithout) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<torch::Tensor> table(2), bias(2), frozen(2);
  auto statuses = testing::RunRanks(coordinator->address(), "ddp-sparse", 2, [&](ProcessGroup& pg) {
    GrpcCollectiveBackend backend(&pg);
    const int r = pg.rank();
    torch::Tensor w = torch::zeros({6, 4}).requires_grad_(true);
    torch::Tensor f = torch::ones({3});
    torch::Tensor b = torch::zeros({4}).requires_grad_(true);
    GradientSync sync(&backend, {w, f, b}, StrategyOptions().bucket_bytes);
    for (torch::Tensor* t : {&w, &b}) t->mutable_grad().reset();
    const torch::Tensor rows =
        r == 0 ? torch::tensor({1, 2, 2}, torch::kLong) : torch::tensor({2, 5}, torch::kLong);
    const torch::Tensor loss =
        (torch::embedding(w, rows, -1, false, /*sparse=*/true).sum() + b.sum()) * (r + 1);
    sync.ExpectSync();
    loss.backward();
    DTRAIN_RETURN_IF_ERROR(sync.AverageGradients());
    table[r] = w.grad();
    bias[r] = b.grad();
    frozen[r] = f.grad();
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  // Rank 0: rows 1 and 2 (twice), weight 1; rank 1: rows 2 and 5, weight 2.
  torch::Tensor expected = torch::zeros({6, 4});
  expected[1] = 0.5;
  expected[2] = 2.0;
  expected[5] = 1.0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(table[r].defined());
    EXPECT_FALSE(table[r].is_sparse());
    EXPECT_TRUE(torch::equal(table[r], expected)) << "rank " << r;
    EXPECT_TRUE(torch::equal(bias[r], torch::full({4}, 1.5))) << "rank " << r;
    EXPECT_FALSE(frozen[r].defined()) << "rank " << r;
  }
}

// Through the accelerator, ddp on 2 ranks: a step where rank 1's backward reaches only the first
// parameter. Rank 1's other gradients, dropped before backward, count as zeros in the mean (as
// when gradients were zeroed in place), the ranks make the same collectives, and end equal.
TEST(DataParallel, ParameterOneRankDoesNotReach_AveragedAsZeros_RanksEqual) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<std::vector<torch::Tensor>> grads(2), trained(2), after_first(2);
  auto statuses =
      testing::RunRanks(coordinator->address(), "ddp-unreached", 2, [&](ProcessGroup& pg) {
        StrategyOptions ddp;
        ddp.name = "ddp";
        auto a = Accelerator::Make("cpu", Precision::k32True, ddp,
                                   std::make_unique<GrpcCollectiveBackend>(&pg));
        if (!a.ok()) return a.status();
        auto model = BuiltinModel("mlp", 3);
        if (!model.ok()) return model.status();
        DTRAIN_RETURN_IF_ERROR(
            (*a)->Setup(std::move(*model), {.name = "sgd", .lr = 0.1, .momentum = 0.9}, {}));
        const std::vector<torch::Tensor> params = (*a)->model().Parameters();
        DTRAIN_RETURN_IF_ERROR((*a)->Backward(SumOfSquares(params, params.size()), false));
        DTRAIN_RETURN_IF_ERROR((*a)->OptimizerStep().status());
        for (const torch::Tensor& p : params) after_first[pg.rank()].push_back(p.detach().clone());
        (*a)->OptimizerZeroGrad();
        DTRAIN_RETURN_IF_ERROR(
            (*a)->Backward(SumOfSquares(params, pg.rank() == 0 ? params.size() : 1), false));
        for (const torch::Tensor& p : params) grads[pg.rank()].push_back(p.grad().clone());
        DTRAIN_RETURN_IF_ERROR((*a)->OptimizerStep().status());
        trained[pg.rank()] = params;
        return (*a)->Teardown();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  auto untrained = BuiltinModel("mlp", 3);
  ASSERT_TRUE(untrained.ok());
  ASSERT_EQ(grads[0].size(), 4u);
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << "ranks' mean differs, parameter " << i;
    EXPECT_TRUE(torch::equal(trained[0][i], trained[1][i])) << "ranks differ, parameter " << i;
    EXPECT_FALSE(torch::equal(trained[0][i], untrained->Parameters()[i])) << "parameter " << i;
  }
  // Step 2's gradients: parameter 0, 2p on both ranks, mean 2p; parameter 1, 2p on rank 0 and
  // none (zeros) on rank 1, mean p (p: the parameter as step 1 left it). Averaging only the
  // ranks that had a gradient would give 2p.
  ASSERT_EQ(after_first[0].size(), 4u);
  EXPECT_TRUE(torch::allclose(grads[0][0], 2 * after_first[0][0], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(grads[0][1], after_first[0][1], 1e-6, 1e-7));
  EXPECT_GT(after_first[0][1].abs().sum().item<double>(), 0.0);
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

}  // namespace worker_distributed_test
}  // namespace dtrain

// Collectives from model code (torch.ops.dtrain, worker/collectives/collective_ops.h): a
// contrastive loss that gathers embeddings with sync_grads trains on 2 ranks to what one process
// computes on the whole batch, a call only one rank makes is named on every rank, and without a
// group the operators are a world of one that TorchScript never optimizes away.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/model/lightning_module.h"
#include "worker/runtime/accelerator.h"

namespace dtrain {
namespace model_collectives_test {

using ::testing::HasSubstr;

// A SimCLR-style model: two views of each sample, the second view's embeddings gathered from
// every rank with sync_grads, the loss an InfoNCE whose positive for row i is its own second
// view (row rank * b + i of the gathered matrix), seen through a learned head. Logs the mean
// positive similarity with sync_dist. Without a group (one process) all_gather is a world of one.
constexpr char kContrastiveSource[] = R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.tanh(torch.linear(torch.relu(torch.linear(x, self.w1, self.b1)), self.w2, self.b2))

def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    x1, x2 = batch
    z1 = self.forward(x1)
    z2 = self.forward(x2)
    everyone = torch.ops.dtrain.all_gather(z2, True).flatten(0, 1)
    logits = torch.matmul(z1, torch.matmul(everyone, self.head).t()) / 0.5
    offset = torch.ops.dtrain.global_rank() * z1.size(0)
    targets = torch.arange(z1.size(0)) + offset
    positive = logits.gather(1, targets.unsqueeze(1)).mean()
    torch.ops.dtrain.log("positive", positive, True)
    torch.ops.dtrain.log("rank", torch.tensor(float(torch.ops.dtrain.global_rank())), False)
    return torch.nll_loss(torch.log_softmax(logits, 1), targets)
)";

// Module::define's resolver knows `torch` as aten's functions only (a file exported from Python
// says ops.dtrain.*, which torch::jit::load resolves); this one also resolves torch.ops.<ns>.<op>,
// so that the source below reads as users write it.
struct OpsNamespace : torch::jit::SugaredValue {
  std::string kind() const override { return "torch.ops"; }
  std::shared_ptr<torch::jit::SugaredValue> attr(const torch::jit::SourceRange&,
                                                 torch::jit::GraphFunction&,
                                                 const std::string& ns) override {
    return std::make_shared<torch::jit::BuiltinModule>(ns);
  }
};
struct TorchWithOps : torch::jit::BuiltinModule {
  TorchWithOps() : BuiltinModule("aten") {}
  std::shared_ptr<torch::jit::SugaredValue> attr(const torch::jit::SourceRange& loc,
                                                 torch::jit::GraphFunction& m,
                                                 const std::string& field) override {
    if (field == "ops") return std::make_shared<OpsNamespace>();
    return BuiltinModule::attr(loc, m, field);
  }
};
struct OpsResolver : torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(
      const std::string& name, torch::jit::GraphFunction& m,
      const torch::jit::SourceRange& loc) override {
    if (name == "torch") return std::make_shared<TorchWithOps>();
    return torch::jit::nativeResolver()->resolveValue(name, m, loc);
  }
  c10::TypePtr resolveType(const std::string& name, const torch::jit::SourceRange& loc) override {
    return torch::jit::nativeResolver()->resolveType(name, loc);
  }
};

void DefineWithOps(torch::jit::Module& m, const std::string& source) {
  m.define(source, std::make_shared<OpsResolver>());
}

LightningModule ContrastiveModel(const std::string& extra_source = "") {
  torch::jit::Module m("Contrastive");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto param = [&](const char* name, std::vector<int64_t> shape) {
    m.register_parameter(name, torch::empty(shape).uniform_(-0.3, 0.3, gen).requires_grad_(true),
                         false);
  };
  param("w1", {16, 12});
  param("b1", {16});
  param("w2", {8, 16});
  param("b2", {8});
  // Used only after the gather, so its gradient (alone in the first bucket) is ready, and its
  // bucket's all_reduce in flight, before the gather's backward runs.
  param("head", {8, 8});
  DefineWithOps(m, kContrastiveSource);
  if (!extra_source.empty()) DefineWithOps(m, extra_source);
  auto wrapped = LightningModule::Wrap(m, "test:contrastive");
  EXPECT_TRUE(wrapped.ok()) << wrapped.status();
  return std::move(*wrapped);
}

// Global batch k: view 1 and a noisy view 2 of the same samples.
std::pair<torch::Tensor, torch::Tensor> TwoViews(int64_t n, int step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  torch::Tensor x = torch::randn({n, 12}, gen);
  return {x, x + 0.1 * torch::randn({n, 12}, gen)};
}

class CollectivesInModelCode : public ::testing::TestWithParam<std::string> {};

// The issue's acceptance test: ddp on 2 ranks, each with half of every global batch, trains the
// contrastive model to what one process computes on the whole batch.
TEST_P(CollectivesInModelCode, AllGatherWithSyncGradsInTheLoss_TwoRanksEqualOneProcess) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  constexpr int kSteps = 8;
  constexpr int64_t kGlobalBatch = 16;
  std::vector<std::vector<torch::Tensor>> trained(2);
  std::vector<std::vector<std::map<std::string, StrategyCollectives::Logged>>> logged(2);
  auto train = [&](Accelerator& a, int rank, int world) -> absl::Status {
    const int64_t b = kGlobalBatch / world;
    for (int step = 0; step < kSteps; ++step) {
      const auto [x1, x2] = TwoViews(kGlobalBatch, step);
      const auto slice = torch::indexing::Slice(rank * b, (rank + 1) * b);
      auto loss =
          a.TrainingStep(c10::ivalue::Tuple::create({x1.index({slice}), x2.index({slice})}), step);
      if (!loss.ok()) return loss.status();
      if (auto s = a.Backward(*loss, /*should_accumulate=*/false); !s.ok()) return s;
      auto stepped = a.OptimizerStep();
      if (!stepped.ok()) return stepped.status();
      a.OptimizerZeroGrad();
      if (rank < static_cast<int>(logged.size()) && world == 2) {
        logged[rank].push_back(a.TakeLogged());
      }
    }
    return absl::OkStatus();
  };
  const OptimizerConfig sgd{.name = "sgd", .lr = 0.5, .momentum = 0.9};
  auto statuses = testing::RunRanks(
      address, "model-gather-" + GetParam(), 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend(GetParam(), address, &pg, absl::Seconds(30));
        if (!backend.ok()) return backend.status();
        StrategyOptions ddp;
        ddp.name = "ddp";
        // Several buckets, in flight while the gather's backward runs (not on shm: one bucket).
        ddp.bucket_bytes = 256;
        auto a = Accelerator::Make("cpu", Precision::k32True, ddp, std::move(*backend));
        if (!a.ok()) return a.status();
        if (auto s = (*a)->Setup(ContrastiveModel(), sgd, {}); !s.ok()) return s;
        if (auto s = train(**a, pg.rank(), 2); !s.ok()) return s;
        trained[pg.rank()] = (*a)->model().Parameters();
        return (*a)->Teardown();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;

  auto single = Accelerator::Make("cpu", Precision::k32True, StrategyOptions(), nullptr);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->Setup(ContrastiveModel(), sgd, {}).ok());
  ASSERT_TRUE(train(**single, 0, 1).ok());
  const std::vector<torch::Tensor> reference = (*single)->model().Parameters();
  const std::vector<torch::Tensor> untrained = ContrastiveModel().Parameters();
  double max_diff = 0, moved = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal(trained[0][i], trained[1][i])) << "ranks differ in parameter " << i;
    max_diff = std::max(max_diff, (trained[0][i] - reference[i]).abs().max().item<double>());
    moved = std::max(moved, (reference[i] - untrained[i]).abs().max().item<double>());
  }
  std::printf(
      "%s: contrastive, 2 ranks vs 1 process on the whole batch: max abs diff %.3g "
      "(parameters moved up to %.3g)\n",
      GetParam().c_str(), max_diff, moved);
  EXPECT_LE(max_diff, 1e-5);
  EXPECT_GT(moved, 0.05);
  // sync_dist: both ranks logged the same mean over ranks; without it each its own value.
  ASSERT_EQ(logged[0].size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(logged[0][step].at("positive").value, logged[1][step].at("positive").value);
    EXPECT_TRUE(logged[0][step].at("positive").options.sync_dist);
    EXPECT_EQ(logged[0][step].at("rank").value, 0.0);
    EXPECT_EQ(logged[1][step].at("rank").value, 1.0);
  }
}

// Rank 0's model code runs a barrier that rank 1's does not: both ranks fail with the plane's
// mismatch error (not the model's INVALID_ARGUMENT), which names what each rank was in.
TEST_P(CollectivesInModelCode, ACallOnlyOneRankMakes_IsNamedOnEveryRank) {
  auto coordinator = testing::StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const std::string address = coordinator->address();
  std::vector<absl::Status> failed(2);
  auto statuses = testing::RunRanks(
      address, "model-mismatch-" + GetParam(), 2, [&](ProcessGroup& pg) -> absl::Status {
        auto backend = MakeBackend(GetParam(), address, &pg, absl::Seconds(10));
        if (!backend.ok()) return backend.status();
        StrategyOptions ddp;
        ddp.name = "ddp";
        auto a = Accelerator::Make("cpu", Precision::k32True, ddp, std::move(*backend));
        if (!a.ok()) return a.status();
        auto model = ContrastiveModel(R"(
def on_train_epoch_start(self) -> None:
    if torch.ops.dtrain.global_rank() == 0:
        torch.ops.dtrain.barrier("only-rank-0")
)");
        if (auto s = (*a)->Setup(std::move(model), {}, {}); !s.ok()) return s;
        failed[pg.rank()] = (*a)->CallHook("on_train_epoch_start");
        if (failed[pg.rank()].ok()) {
          // Rank 1 went on to the step; its all_gather meets rank 0's barrier.
          const auto [x1, x2] = TwoViews(4, 0);
          failed[pg.rank()] = (*a)->TrainingStep(c10::ivalue::Tuple::create({x1, x2}), 0).status();
        }
        return absl::OkStatus();
      });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    std::printf("%s, rank %d: %s\n", GetParam().c_str(), r, failed[r].ToString().c_str());
    EXPECT_EQ(failed[r].code(), absl::StatusCode::kFailedPrecondition) << failed[r];
    EXPECT_THAT(std::string(failed[r].message()), HasSubstr("barrier")) << failed[r];
    EXPECT_THAT(std::string(failed[r].message()), HasSubstr("all_gather")) << failed[r];
    EXPECT_THAT(std::string(failed[r].message()), HasSubstr("raised in model code")) << failed[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Planes, CollectivesInModelCode, ::testing::Values("grpc", "shm"));

// Without a group the operators are a world of one, and TorchScript keeps every call (a barrier
// that returns nothing is not dropped as dead code).
TEST(ModelCollectivesAlone, AWorldOfOne_AndNoCallOptimizedAway) {
  torch::jit::Module m("Alone");
  DefineWithOps(m, R"(
def forward(self, x: Tensor) -> Tensor:
    torch.ops.dtrain.barrier("b")
    torch.ops.dtrain.log("x", x.sum(), True)
    g = torch.ops.dtrain.all_gather(x, False)
    h = torch.ops.dtrain.all_gather(x, False)
    r = torch.ops.dtrain.all_reduce(x, "max")
    b = torch.ops.dtrain.broadcast(x, 0)
    keep = torch.ops.dtrain.reduce_boolean_decision(True, True)
    return g + h + r + b + float(torch.ops.dtrain.world_size() + torch.ops.dtrain.global_rank()) + float(keep)
)");
  const torch::Tensor x = torch::tensor({1.0f, 2.0f});
  const torch::Tensor out = m.forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(out, torch::tensor({{6.0f, 10.0f}}))) << out;
  const std::string graph = m.get_method("forward").graph()->toString();
  EXPECT_THAT(graph, HasSubstr("dtrain::barrier"));
  EXPECT_THAT(graph, HasSubstr("dtrain::log"));
  size_t gathers = 0;
  for (size_t at = graph.find("dtrain::all_gather"); at != std::string::npos;
       at = graph.find("dtrain::all_gather", at + 1)) {
    ++gathers;
  }
  EXPECT_EQ(gathers, 2u);
  DefineWithOps(m, R"(
def bad(self, x: Tensor) -> Tensor:
    return torch.ops.dtrain.all_reduce(x, "median")
)");
  try {
    m.run_method("bad", x);
    ADD_FAILURE() << "an unknown reduce op was accepted";
  } catch (const std::exception& e) {  // the interpreter's JITException
    EXPECT_THAT(e.what(), HasSubstr("unknown reduce op 'median'"));
  }
}

}  // namespace model_collectives_test
}  // namespace dtrain

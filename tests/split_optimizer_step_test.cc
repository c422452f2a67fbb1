// ddp's split optimizer step (worker/strategies/split_optimizer_step.h) against torch's own
// optimizers over whole tensors, for each of the five that split (SGD, Adam, AdamW, RMSprop,
// Adagrad): a bucket's parts stepped apart (split inside parameters, off the kernels' vector
// width, one part of a tensor large enough for ATen to cut its kernels into threads' chunks) end
// every step with bitwise the parameters of the whole step, for two param groups with every
// option of the kind and a learning rate changed mid-run; the consolidated state (every tensor
// and the step count) is torch's, bit for bit; after a restore the parts continue from the full
// optimizer's state; and a fresh optimizer's first step is torch's.
#include "worker/strategies/split_optimizer_step.h"

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "worker/collectives/collective_backend.h"
#include "worker/model/optimizers.h"
#include "worker/strategies/elementwise_optimizer.h"
#include "worker/strategies/gradient_sync.h"

namespace dtrain {
namespace split_optimizer_step_test {

namespace optim = torch::optim;
using Groups = std::vector<optim::OptimizerParamGroup>;

// One optimizer kind: it builds the optimizer over four parameters in two groups, each group with
// options of its own that exercise the kind's every branch.
struct Kind {
  std::string name;
  std::function<std::unique_ptr<optim::Optimizer>(const std::vector<torch::Tensor>&)> make;
};

void PrintTo(const Kind& kind, std::ostream* out) { *out << kind.name; }

template <typename O, typename Options>
std::unique_ptr<optim::Optimizer> Make(const std::vector<torch::Tensor>& p, Options first,
                                       Options second, Options defaults) {
  Groups groups;
  groups.emplace_back(std::vector<torch::Tensor>{p[0], p[1]},
                      std::make_unique<Options>(std::move(first)));
  groups.emplace_back(std::vector<torch::Tensor>{p[2], p[3]},
                      std::make_unique<Options>(std::move(second)));
  return std::make_unique<O>(std::move(groups), std::move(defaults));
}

std::vector<Kind> Kinds() {
  return {
      {"SGD",
       [](const std::vector<torch::Tensor>& p) {
         return Make<optim::SGD>(
             p, optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3).nesterov(true),
             optim::SGDOptions(0.2).momentum(0.5).dampening(0.1), optim::SGDOptions(0.05));
       }},
      {"Adam",
       [](const std::vector<torch::Tensor>& p) {
         return Make<optim::Adam>(p, optim::AdamOptions(0.01).weight_decay(1e-3).amsgrad(true),
                                  optim::AdamOptions(0.02).betas({0.8, 0.99}).eps(1e-6),
                                  optim::AdamOptions());
       }},
      {"AdamW",
       [](const std::vector<torch::Tensor>& p) {
         return Make<optim::AdamW>(p, optim::AdamWOptions(0.01).weight_decay(0.05).amsgrad(true),
                                   optim::AdamWOptions(0.02), optim::AdamWOptions());
       }},
      {"RMSprop",
       [](const std::vector<torch::Tensor>& p) {
         return Make<optim::RMSprop>(
             p, optim::RMSpropOptions(0.01).centered(true).momentum(0.9).weight_decay(1e-3),
             optim::RMSpropOptions(0.02).alpha(0.9), optim::RMSpropOptions());
       }},
      {"Adagrad",
       [](const std::vector<torch::Tensor>& p) {
         return Make<optim::Adagrad>(p,
                                     optim::AdagradOptions(0.05).lr_decay(0.01).weight_decay(1e-3),
                                     optim::AdagradOptions(0.1).eps(1e-6),
                                     optim::AdagradOptions().initial_accumulator_value(0.1));
       }},
  };
}

class SplitOptimizerStepTest : public ::testing::TestWithParam<Kind> {};

// Every tensor of the two states and their step counts are equal; some tensor is not zero
// (a real comparison).
void ExpectSameState(const optim::Optimizer& split, const torch::Tensor& p,
                     const optim::Optimizer& whole, const torch::Tensor& reference,
                     const std::string& what) {
  const ElementwiseOptimizer* kind = ElementwiseOptimizer::Of(whole);
  ASSERT_NE(kind, nullptr);
  std::optional<ElementwiseState> a = kind->Read(split, p), b = kind->Read(whole, reference);
  ASSERT_TRUE(a.has_value()) << what;
  ASSERT_TRUE(b.has_value()) << what;
  EXPECT_EQ(a->step, b->step) << what;
  bool nonzero = false;
  for (size_t t = 0; t < ElementwiseState::kTensors; ++t) {
    ASSERT_EQ(a->tensors[t].defined(), b->tensors[t].defined()) << what << ", tensor " << t;
    if (!b->tensors[t].defined()) continue;
    EXPECT_TRUE(torch::equal(a->tensors[t], b->tensors[t])) << what << ", tensor " << t;
    nonzero = nonzero || b->tensors[t].abs().max().item<double>() > 0;
  }
  EXPECT_TRUE(nonzero) << what;
}

TEST_P(SplitOptimizerStepTest, PartsSteppedApartEqualTorchsWholeStep_BitForBit) {
  const Kind& kind = GetParam();
  // Two threads: ATen cuts the large parameter's kernels into chunks that differ between the
  // whole tensor and its part.
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  LocalCollectiveBackend local;
  at::Generator init = at::detail::createCPUGenerator(3);
  std::vector<torch::Tensor> params, reference;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{300, 257}, {29}, {300}, {5, 7}}) {
    params.push_back(torch::randn(shape, init).requires_grad_(true));
    reference.push_back(params.back().detach().clone().requires_grad_(true));
  }
  GradientSync sync(&local, params, /*bucket_bytes=*/1 << 20, /*overlap_with_backward=*/false);
  ASSERT_EQ(sync.bucket_count(), 1u);
  // A world of one shares no memory: placed all the same, in ordinary memory.
  absl::StatusOr<bool> shared = sync.PlaceParametersBesideBuckets();
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_FALSE(*shared);
  // The parameters now live beside the bucket, with their values.
  for (size_t i = 0; i < params.size(); ++i) ASSERT_TRUE(torch::equal(params[i], reference[i]));
  const int64_t n = sync.bucket_flat(0).numel();
  std::unique_ptr<optim::Optimizer> full = kind.make(params), whole = kind.make(reference);
  EXPECT_TRUE(SplitOptimizerStep::Splits(*full));
  auto split = std::make_unique<SplitOptimizerStep>(full.get(), &sync, params);
  // Three parts: one inside the last parameter of the bucket (the first in order), the other
  // inside the first (the last), at odd element counts.
  const std::vector<int64_t> cuts = {0, 13, 1077, n};
  at::Generator noise = at::detail::createCPUGenerator(9);
  auto step = [&](int s) {
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor g = torch::randn(params[i].sizes(), noise);
      params[i].grad().copy_(g);  // the bucket's slice
      reference[i].mutable_grad() = g.clone();
    }
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      absl::Status stepped = split->Update(0, cuts[k], cuts[k + 1]);
      ASSERT_TRUE(stepped.ok()) << stepped;
    }
    whole->step();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(torch::equal(params[i], reference[i]))
          << kind.name << ", step " << s << ", parameter " << i << ": "
          << (params[i] - reference[i]).abs().max().item<double>();
    }
  };
  for (int s = 0; s < 10; ++s) step(s);
  // A scheduler's new rate, set on the full optimizer only, reaches the parts.
  full->param_groups()[1].options().set_lr(0.01);
  whole->param_groups()[1].options().set_lr(0.01);
  for (int s = 10; s < 20; ++s) step(s);

  // The consolidated state is the whole step's; the parameters moved (a real comparison).
  ASSERT_TRUE(split->Consolidate(&local).ok());
  for (size_t i = 0; i < params.size(); ++i) {
    ExpectSameState(*full, params[i], *whole, reference[i], "parameter " + std::to_string(i));
  }

  // A restore: the full optimizer's state is replaced (here by a perturbed copy of torch's),
  // and after Reset the parts continue from it, as torch continues from the same state.
  const ElementwiseOptimizer* elementwise = ElementwiseOptimizer::Of(*whole);
  for (size_t i = 0; i < params.size(); ++i) {
    ElementwiseState state = *elementwise->Read(*whole, reference[i]);
    for (torch::Tensor& t : state.tensors) {
      if (t.defined()) t.mul_(0.5);  // also whole's own (the getters share the tensors)
    }
    ElementwiseState copy{{}, state.step};
    for (size_t t = 0; t < ElementwiseState::kTensors; ++t) {
      if (state.tensors[t].defined()) copy.tensors[t] = state.tensors[t].clone();
    }
    elementwise->Write(*full, params[i], copy);
  }
  // After a restore: the parts start over from the full optimizer's state, step `from` to
  // `from` + 5, and their consolidated state is the whole step's.
  auto steps_after_restore = [&](int from, const std::string& what) {
    split->Reset();
    for (int s = from; s < from + 5; ++s) step(s);
    ASSERT_TRUE(split->Consolidate(&local).ok());
    for (size_t i = 0; i < params.size(); ++i) {
      ExpectSameState(*full, params[i], *whole, reference[i],
                      what + ", parameter " + std::to_string(i));
    }
  };
  steps_after_restore(20, "after the restore");

  // A restore whose parameters' states differ from their neighbours' in a part: parameter 2
  // (beside parameter 3, in its group) has none, as a checkpoint's `momentum_buffer: None` gives,
  // and parameter 1 (beside parameter 0) a step count of its own. Torch starts the first fresh
  // and counts each on; the parts must not step either as one tensor with its neighbour.
  for (const auto& [optimizer, tensors] :
       {std::pair{full.get(), &params}, std::pair{whole.get(), &reference}}) {
    // Adagrad makes every state in its constructor and steps no parameter without one.
    if (kind.name != "Adagrad") optimizer->state().erase(OptimizerStateKey((*tensors)[2]));
    ElementwiseState state = *elementwise->Read(*optimizer, (*tensors)[1]);
    if (state.step > 0) {
      state.step += 3;
      elementwise->Write(*optimizer, (*tensors)[1], state);
    }
  }
  steps_after_restore(25, "after a restore of unlike states");

  // A new SplitOptimizerStep over a full optimizer that has never stepped starts its state as
  // torch does.
  std::unique_ptr<optim::Optimizer> fresh_full = kind.make(params);
  std::unique_ptr<optim::Optimizer> fresh_whole = kind.make(reference);
  const size_t states_before = fresh_full->state().size();  // Adagrad's constructor makes them
  split = std::make_unique<SplitOptimizerStep>(fresh_full.get(), &sync, params);
  // No part has stepped: consolidating keeps the full optimizer's state as it was.
  ASSERT_TRUE(split->Consolidate(&local).ok());
  EXPECT_EQ(fresh_full->state().size(), states_before);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].grad().copy_(torch::ones_like(params[i]));
    reference[i].mutable_grad() = torch::ones_like(reference[i]);
  }
  for (size_t k = 0; k + 1 < cuts.size(); ++k)
    ASSERT_TRUE(split->Update(0, cuts[k], cuts[k + 1]).ok());
  fresh_whole->step();
  ASSERT_TRUE(split->Consolidate(&local).ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], reference[i])) << i;
    ExpectSameState(*fresh_full, params[i], *fresh_whole, reference[i],
                    "fresh, parameter " + std::to_string(i));
  }
  at::set_num_threads(threads);
}

INSTANTIATE_TEST_SUITE_P(Kinds, SplitOptimizerStepTest, ::testing::ValuesIn(Kinds()),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param.name;
                         });

// Only libtorch's five elementwise optimizers split; LBFGS's step reads every element at once.
TEST(SplitOptimizerStep, OnlyTheElementwiseOptimizersSplit) {
  std::vector<torch::Tensor> p = {torch::zeros({3}, torch::requires_grad())};
  EXPECT_TRUE(SplitOptimizerStep::Splits(optim::SGD(p, optim::SGDOptions(0.1))));
  EXPECT_TRUE(SplitOptimizerStep::Splits(optim::Adagrad(p)));
  EXPECT_FALSE(SplitOptimizerStep::Splits(optim::LBFGS(p)));
  // A subclass may step otherwise.
  struct OwnSgd : optim::SGD {
    using optim::SGD::SGD;
  };
  EXPECT_FALSE(SplitOptimizerStep::Splits(OwnSgd(p, optim::SGDOptions(0.1))));
}

}  // namespace split_optimizer_step_test
}  // namespace dtrain

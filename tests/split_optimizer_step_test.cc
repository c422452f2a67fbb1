// ddp's split optimizer step (worker/strategies/split_optimizer_step.h) against torch's SGD
// over whole tensors: a bucket's parts stepped apart (split inside parameters, off the kernels'
// vector width) end every step with bitwise the parameters of the whole step, for every SGD
// option, two param groups and a learning rate changed mid-run; the consolidated momentum is
// torch's, bit for bit; after a restore the parts continue from the full optimizer's state.
#include "worker/strategies/split_optimizer_step.h"

#include <memory>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "worker/collectives/collective_backend.h"
#include "worker/model/optimizers.h"
#include "worker/strategies/gradient_sync.h"

namespace dtrain {
namespace split_optimizer_step_test {

std::vector<torch::optim::OptimizerParamGroup> Groups(const std::vector<torch::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{p[0], p[1]},
      std::make_unique<torch::optim::SGDOptions>(
          torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3).nesterov(true)));
  groups.emplace_back(std::vector<torch::Tensor>{p[2], p[3]},
                      std::make_unique<torch::optim::SGDOptions>(
                          torch::optim::SGDOptions(0.2).momentum(0.5).dampening(0.1)));
  return groups;
}

const torch::Tensor& Momentum(torch::optim::Optimizer& o, const torch::Tensor& p) {
  return static_cast<torch::optim::SGDParamState&>(*o.state().at(OptimizerStateKey(p)))
      .momentum_buffer();
}

TEST(SplitOptimizerStep, PartsSteppedApartEqualTorchsWholeStep_BitForBit) {
  LocalCollectiveBackend local;
  at::Generator init = at::detail::createCPUGenerator(3);
  std::vector<torch::Tensor> params, reference;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{37, 29}, {29}, {300}, {5, 7}}) {
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
  torch::optim::SGD full(Groups(params), torch::optim::SGDOptions(0.05));
  torch::optim::SGD whole(Groups(reference), torch::optim::SGDOptions(0.05));
  EXPECT_TRUE(SplitOptimizerStep::Splits(full));
  EXPECT_FALSE(SplitOptimizerStep::Splits(torch::optim::Adam(reference)));
  auto split = std::make_unique<SplitOptimizerStep>(&full, &sync, params);
  // Three parts: one inside the first parameter of the bucket (the last in order), at odd
  // element counts.
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
    whole.step();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(torch::equal(params[i], reference[i]))
          << "step " << s << ", parameter " << i << ": "
          << (params[i] - reference[i]).abs().max().item<double>();
    }
  };
  for (int s = 0; s < 10; ++s) step(s);
  // A scheduler's new rate, set on the full optimizer only, reaches the parts.
  full.param_groups()[1].options().set_lr(0.01);
  whole.param_groups()[1].options().set_lr(0.01);
  for (int s = 10; s < 20; ++s) step(s);

  // The consolidated momentum is the whole step's; the parameters moved (a real comparison).
  ASSERT_TRUE(split->Consolidate(&local).ok());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(full.state().count(OptimizerStateKey(params[i])), 1u) << i;
    EXPECT_TRUE(torch::equal(Momentum(full, params[i]), Momentum(whole, reference[i]))) << i;
    EXPECT_GT(Momentum(whole, reference[i]).abs().max().item<double>(), 0) << i;
  }

  // A restore: the full optimizer's state is replaced (here by a perturbed copy of torch's),
  // and after Reset the parts continue from it, as torch continues from the same state.
  for (size_t i = 0; i < params.size(); ++i) {
    Momentum(whole, reference[i]).mul_(0.5);
    Momentum(full, params[i]).copy_(Momentum(whole, reference[i]));
  }
  split->Reset();
  for (int s = 20; s < 25; ++s) step(s);

  // A new SplitOptimizerStep over a full optimizer that has never stepped starts momentum as
  // torch does (a clone of the first gradient, weight decay added).
  torch::optim::SGD fresh_full(Groups(params), torch::optim::SGDOptions(0.05));
  torch::optim::SGD fresh_whole(Groups(reference), torch::optim::SGDOptions(0.05));
  split = std::make_unique<SplitOptimizerStep>(&fresh_full, &sync, params);
  // No part has stepped: consolidating keeps (here: leaves empty) the full optimizer's state.
  ASSERT_TRUE(split->Consolidate(&local).ok());
  EXPECT_TRUE(fresh_full.state().empty());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].grad().copy_(torch::ones_like(params[i]));
    reference[i].mutable_grad() = torch::ones_like(reference[i]);
  }
  for (size_t k = 0; k + 1 < cuts.size(); ++k)
    ASSERT_TRUE(split->Update(0, cuts[k], cuts[k + 1]).ok());
  fresh_whole.step();
  ASSERT_TRUE(split->Consolidate(&local).ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], reference[i])) << i;
    EXPECT_TRUE(torch::equal(Momentum(fresh_full, params[i]), Momentum(fresh_whole, reference[i])))
        << i;
  }
}

}  // namespace split_optimizer_step_test
}  // namespace dtrain

// The optimizers whose step updates each element of a parameter from that element alone (its
// value, gradient and state): libtorch's SGD, Adam, AdamW, RMSprop and Adagrad. For them a step
// can be cut into parts by elements (SplitOptimizerStep). This is where each one's options and
// per-parameter state are named: a state is up to three tensors shaped like the parameter (say
// Adam's exp_avg, exp_avg_sq and max_exp_avg_sq) and a step count, so that a part's state can be
// cut out of the whole optimizer's and put back.
//
// Thread-safety: none (an optimizer's own rules apply).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

namespace dtrain {

// One parameter's state: the tensors (undefined where the optimizer keeps none, as SGD without
// momentum) and the step count (0 for SGD, which keeps none).
struct ElementwiseState {
  static constexpr size_t kTensors = 3;
  std::array<torch::Tensor, kTensors> tensors;
  int64_t step = 0;
};

class ElementwiseOptimizer {
 public:
  virtual ~ElementwiseOptimizer() = default;

  // The kind of `optimizer`, or null when its step is not elementwise or it is not exactly one
  // of libtorch's five (a subclass may step otherwise).
  static const ElementwiseOptimizer* Of(const torch::optim::Optimizer& optimizer);

  // The same optimizer over `groups` (each with its own options). Neutral defaults, save what
  // the constructor takes from them alone (Adagrad's initial accumulator, from `like`'s).
  virtual std::unique_ptr<torch::optim::Optimizer> Make(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const torch::optim::Optimizer& like) const = 0;

  // Makes `to` equal `from`, both this kind's options.
  virtual void CopyOptions(const torch::optim::OptimizerOptions& from,
                           torch::optim::OptimizerOptions& to) const = 0;

  // `parameter`'s state in `optimizer` (this kind), if it has any.
  virtual std::optional<ElementwiseState> Read(const torch::optim::Optimizer& optimizer,
                                               const torch::Tensor& parameter) const = 0;

  // Sets `parameter`'s state in `optimizer` (this kind) to `state`.
  virtual void Write(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter,
                     const ElementwiseState& state) const = 0;
};

}  // namespace dtrain

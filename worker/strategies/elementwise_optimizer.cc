#include "worker/strategies/elementwise_optimizer.h"

#include <typeinfo>
#include <utility>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "worker/model/optimizers.h"

namespace dtrain {
namespace {

namespace optim = torch::optim;

// One of libtorch's optimizers, given how its state maps to an ElementwiseState.
template <typename O, typename Options, typename State>
class KindOf final : public ElementwiseOptimizer {
 public:
  using DefaultsFn = Options (*)(const optim::Optimizer& like);
  using ReadFn = ElementwiseState (*)(const State&);
  using WriteFn = void (*)(const ElementwiseState&, State&);

  KindOf(DefaultsFn defaults, ReadFn read, WriteFn write)
      : defaults_(defaults), read_(read), write_(write) {}

  bool Is(const optim::Optimizer& optimizer) const { return typeid(optimizer) == typeid(O); }

  std::unique_ptr<optim::Optimizer> Make(std::vector<optim::OptimizerParamGroup> groups,
                                         const optim::Optimizer& like) const override {
    return std::make_unique<O>(std::move(groups), defaults_(like));
  }

  void CopyOptions(const optim::OptimizerOptions& from,
                   optim::OptimizerOptions& to) const override {
    static_cast<Options&>(to) = static_cast<const Options&>(from);
  }

  std::optional<ElementwiseState> Read(const optim::Optimizer& optimizer,
                                       const torch::Tensor& parameter) const override {
    auto it = optimizer.state().find(OptimizerStateKey(parameter));
    if (it == optimizer.state().end()) return std::nullopt;
    return read_(static_cast<const State&>(*it->second));
  }

  void Write(optim::Optimizer& optimizer, const torch::Tensor& parameter,
             const ElementwiseState& state) const override {
    auto written = std::make_unique<State>();
    write_(state, *written);
    optimizer.state()[OptimizerStateKey(parameter)] = std::move(written);
  }

 private:
  const DefaultsFn defaults_;
  const ReadFn read_;
  const WriteFn write_;
};

// Adam and AdamW keep the same state under different types.
template <typename State>
ElementwiseState ReadAdam(const State& s) {
  return {{s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()}, s.step()};
}
template <typename State>
void WriteAdam(const ElementwiseState& from, State& s) {
  s.exp_avg(from.tensors[0]).exp_avg_sq(from.tensors[1]).max_exp_avg_sq(from.tensors[2]);
  s.step(from.step);
}

// Neutral defaults: each group has its own options, and a constructor checks only the defaults,
// which must not refuse what a scheduler made of the job's (SGD: momentum 0 with Nesterov).
const KindOf<optim::SGD, optim::SGDOptions, optim::SGDParamState> kSgd(
    [](const optim::Optimizer&) { return optim::SGDOptions(0); },
    [](const optim::SGDParamState& s) {
      return ElementwiseState{{s.momentum_buffer()}, 0};
    },
    [](const ElementwiseState& from, optim::SGDParamState& s) {
      s.momentum_buffer(from.tensors[0]);
    });
const KindOf<optim::Adam, optim::AdamOptions, optim::AdamParamState> kAdam(
    [](const optim::Optimizer&) { return optim::AdamOptions(); }, ReadAdam, WriteAdam);
const KindOf<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState> kAdamW(
    [](const optim::Optimizer&) { return optim::AdamWOptions(); }, ReadAdam, WriteAdam);
const KindOf<optim::RMSprop, optim::RMSpropOptions, optim::RMSpropParamState> kRmsprop(
    [](const optim::Optimizer&) { return optim::RMSpropOptions(); },
    [](const optim::RMSpropParamState& s) {
      return ElementwiseState{{s.square_avg(), s.momentum_buffer(), s.grad_avg()}, s.step()};
    },
    [](const ElementwiseState& from, optim::RMSpropParamState& s) {
      s.square_avg(from.tensors[0]).momentum_buffer(from.tensors[1]).grad_avg(from.tensors[2]);
      s.step(from.step);
    });
// Adagrad's constructor gives every parameter a state from its defaults' initial accumulator.
const KindOf<optim::Adagrad, optim::AdagradOptions, optim::AdagradParamState> kAdagrad(
    [](const optim::Optimizer& like) {
      return optim::AdagradOptions().initial_accumulator_value(
          static_cast<const optim::AdagradOptions&>(like.defaults()).initial_accumulator_value());
    },
    [](const optim::AdagradParamState& s) {
      return ElementwiseState{{s.sum()}, s.step()};
    },
    [](const ElementwiseState& from, optim::AdagradParamState& s) {
      s.sum(from.tensors[0]).step(from.step);
    });

}  // namespace

const ElementwiseOptimizer* ElementwiseOptimizer::Of(const torch::optim::Optimizer& optimizer) {
  if (kSgd.Is(optimizer)) return &kSgd;
  if (kAdam.Is(optimizer)) return &kAdam;
  if (kAdamW.Is(optimizer)) return &kAdamW;
  if (kRmsprop.Is(optimizer)) return &kRmsprop;
  if (kAdagrad.Is(optimizer)) return &kAdagrad;
  return nullptr;
}

}  // namespace dtrain

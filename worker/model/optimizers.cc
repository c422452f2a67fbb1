#include "worker/model/optimizers.h"

#include <cmath>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(what);
}

absl::Status CheckOptions(const OptimizerConfig& c) {
  for (const absl::Status& s : {
           Check(c.lr >= 0 && std::isfinite(c.lr),
                 absl::StrCat("optimizer lr must be >= 0, got ", c.lr)),
           Check(c.momentum >= 0 && c.momentum < 1,
                 absl::StrCat("optimizer momentum must be in [0, 1), got ", c.momentum)),
           Check(c.weight_decay >= 0,
                 absl::StrCat("optimizer weight_decay must be >= 0, got ", c.weight_decay)),
           Check(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
                 absl::StrCat("optimizer betas must be in [0, 1), got ", c.beta1, ", ", c.beta2)),
           Check(c.eps >= 0, absl::StrCat("optimizer eps must be >= 0, got ", c.eps)),
           Check(c.dampening >= 0 && c.dampening <= 1,
                 absl::StrCat("optimizer dampening must be in [0, 1], got ", c.dampening)),
           Check(c.alpha >= 0 && c.alpha <= 1,
                 absl::StrCat("optimizer alpha must be in [0, 1], got ", c.alpha)),
           Check(c.lr_decay >= 0,
                 absl::StrCat("optimizer lr_decay must be >= 0, got ", c.lr_decay)),
           Check(c.initial_accumulator_value >= 0,
                 absl::StrCat("optimizer initial_accumulator_value must be >= 0, got ",
                              c.initial_accumulator_value)),
       }) {
    if (!s.ok()) return s;
  }
  if (c.name == "sgd" && c.nesterov && (c.momentum <= 0 || c.dampening != 0)) {
    return absl::InvalidArgumentError(
        "sgd: nesterov needs momentum > 0 and dampening 0 (as in torch)");
  }
  return absl::OkStatus();
}

// One optimizer kind: libtorch's options for a param group, and the optimizer over groups.
struct OptimizerKind {
  const char* name;
  std::unique_ptr<torch::optim::OptimizerOptions> (*options)(const OptimizerConfig& c);
  std::unique_ptr<torch::optim::Optimizer> (*build)(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const torch::optim::OptimizerOptions& defaults);
};

template <typename Optimizer, typename Options>
std::unique_ptr<torch::optim::Optimizer> BuildAs(
    std::vector<torch::optim::OptimizerParamGroup> groups,
    const torch::optim::OptimizerOptions& defaults) {
  return std::make_unique<Optimizer>(std::move(groups), static_cast<const Options&>(defaults));
}

template <typename Options>
std::unique_ptr<torch::optim::OptimizerOptions> Own(Options options) {
  return std::make_unique<Options>(std::move(options));
}

const OptimizerKind kOptimizerKinds[] = {
    {"sgd",
     [](const OptimizerConfig& c) {
       return Own(torch::optim::SGDOptions(c.lr)
                      .momentum(c.momentum)
                      .dampening(c.dampening)
                      .nesterov(c.nesterov)
                      .weight_decay(c.weight_decay));
     },
     BuildAs<torch::optim::SGD, torch::optim::SGDOptions>},
    {"adam",
     [](const OptimizerConfig& c) {
       return Own(torch::optim::AdamOptions(c.lr)
                      .betas({c.beta1, c.beta2})
                      .eps(c.eps)
                      .weight_decay(c.weight_decay)
                      .amsgrad(c.amsgrad));
     },
     BuildAs<torch::optim::Adam, torch::optim::AdamOptions>},
    {"adamw",
     [](const OptimizerConfig& c) {
       return Own(torch::optim::AdamWOptions(c.lr)
                      .betas({c.beta1, c.beta2})
                      .eps(c.eps)
                      .weight_decay(c.weight_decay)
                      .amsgrad(c.amsgrad));
     },
     BuildAs<torch::optim::AdamW, torch::optim::AdamWOptions>},
    {"rmsprop",
     [](const OptimizerConfig& c) {
       return Own(torch::optim::RMSpropOptions(c.lr)
                      .alpha(c.alpha)
                      .eps(c.eps)
                      .weight_decay(c.weight_decay)
                      .momentum(c.momentum)
                      .centered(c.centered));
     },
     BuildAs<torch::optim::RMSprop, torch::optim::RMSpropOptions>},
    {"adagrad",
     [](const OptimizerConfig& c) {
       return Own(torch::optim::AdagradOptions(c.lr)
                      .lr_decay(c.lr_decay)
                      .weight_decay(c.weight_decay)
                      .initial_accumulator_value(c.initial_accumulator_value)
                      .eps(c.eps));
     },
     BuildAs<torch::optim::Adagrad, torch::optim::AdagradOptions>},
};

absl::StatusOr<const OptimizerKind*> FindKind(const std::string& name) {
  for (const OptimizerKind& kind : kOptimizerKinds) {
    if (name == kind.name) return &kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name, "'; use sgd, adam, adamw, rmsprop or adagrad"));
}

// libtorch's options object of `name` for one param group.
absl::StatusOr<std::unique_ptr<torch::optim::OptimizerOptions>> MakeOptions(
    const std::string& name, const OptimizerConfig& c) {
  DTRAIN_RETURN_IF_ERROR(CheckOptions(c));
  DTRAIN_ASSIGN_OR_RETURN(const OptimizerKind* kind, FindKind(name));
  return kind->options(c);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> Build(
    const std::string& name, std::vector<torch::optim::OptimizerParamGroup> groups,
    const OptimizerConfig& defaults) {
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::OptimizerOptions> options,
                          MakeOptions(name, defaults));
  DTRAIN_ASSIGN_OR_RETURN(const OptimizerKind* kind, FindKind(name));
  return kind->build(std::move(groups), *options);
}

}  // namespace

std::string OptimizerStateKey(const torch::Tensor& parameter) {
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
}

std::string TorchOptimizerClass(const std::string& name) {
  if (name == "sgd") return "SGD";
  if (name == "adam") return "Adam";
  if (name == "adamw") return "AdamW";
  if (name == "rmsprop") return "RMSprop";
  if (name == "adagrad") return "Adagrad";
  return name;
}

absl::StatusOr<OptimizerConfig> OptimizerFromRecipe(const v1::OptimizerRecipe& recipe) {
  OptimizerConfig config;
  const std::string& kind = recipe.kind();
  for (const char* name : {"sgd", "adam", "adamw", "rmsprop", "adagrad"}) {
    if (TorchOptimizerClass(name) == kind) config.name = name;
  }
  if (TorchOptimizerClass(config.name) != kind) {
    return absl::InvalidArgumentError(
        absl::StrCat("configure_optimizers: optimizer ", kind,
                     " is not supported; use SGD, Adam, AdamW, RMSprop or Adagrad"));
  }
  if (recipe.groups().empty()) {
    return absl::InvalidArgumentError("configure_optimizers: the optimizer has no param groups");
  }
  for (const v1::ParamGroupRecipe& g : recipe.groups()) {
    ParamGroupConfig group;
    group.params.assign(g.params().begin(), g.params().end());
    OptimizerConfig& o = group.options;
    o.name = config.name;
    o.lr = g.lr();
    o.momentum = g.momentum();
    o.nesterov = g.nesterov();
    o.weight_decay = g.weight_decay();
    o.beta1 = g.beta1();
    o.beta2 = g.beta2();
    o.eps = g.eps();
    o.dampening = g.dampening();
    o.amsgrad = g.amsgrad();
    o.alpha = g.alpha();
    o.centered = g.centered();
    o.lr_decay = g.lr_decay();
    o.initial_accumulator_value = g.initial_accumulator_value();
    DTRAIN_RETURN_IF_ERROR(CheckOptions(o));
    config.groups.push_back(std::move(group));
  }
  // The first group's options stand for the optimizer's defaults.
  OptimizerConfig first = config.groups.front().options;
  first.groups = std::move(config.groups);
  return first;
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    std::vector<torch::Tensor> parameters, const OptimizerConfig& c) {
  if (c.groups.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("this strategy steps one param group per rank; configure_optimizers returned ",
                     c.groups.size(), ": use one group, or the ddp strategy"));
  }
  const OptimizerConfig& options = c.groups.empty() ? c : c.groups.front().options;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(parameters));
  return Build(c.name, std::move(groups), options);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
    const OptimizerConfig& c) {
  if (c.groups.empty()) {
    std::vector<torch::Tensor> all;
    for (const auto& [name, p] : parameters) all.push_back(p);
    return MakeOptimizer(std::move(all), c);
  }
  absl::flat_hash_map<std::string, torch::Tensor> by_name;
  for (const auto& [name, p] : parameters) by_name[name] = p;
  absl::flat_hash_set<std::string> taken;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t i = 0; i < c.groups.size(); ++i) {
    std::vector<torch::Tensor> tensors;
    for (const std::string& name : c.groups[i].params) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat("configure_optimizers: param group ", i,
                                                       " names '", name,
                                                       "', which is not a parameter of the model"));
      }
      if (!taken.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat("configure_optimizers: parameter '", name,
                                                       "' is in more than one param group"));
      }
      tensors.push_back(it->second);
    }
    DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::OptimizerOptions> options,
                            MakeOptions(c.name, c.groups[i].options));
    groups.emplace_back(std::move(tensors), std::move(options));
  }
  return Build(c.name, std::move(groups), c);
}

void WriteGroupRates(torch::optim::Optimizer& optimizer, const std::vector<GroupRates>& rates) {
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size() && i < rates.size(); ++i) {
    torch::optim::OptimizerOptions& o = groups[i].options();
    o.set_lr(rates[i].lr);
    if (!rates[i].momentum.has_value()) continue;
    const double m = *rates[i].momentum;
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) sgd->momentum(m);
    if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o))
      adam->betas({m, std::get<1>(adam->betas())});
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&o))
      adamw->betas({m, std::get<1>(adamw->betas())});
    if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) rms->momentum(m);
  }
}

absl::StatusOr<LrSchedule> LrSchedule::Make(const SchedulerConfig& c, double base_lr) {
  if (c.name == "none") return LrSchedule(c, base_lr);
  if (c.name == "step") {
    if (c.step_size < 1 || c.gamma <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step schedule needs step_size >= 1 and gamma > 0, got ", c.step_size, ", ", c.gamma));
    }
    return LrSchedule(c, base_lr);
  }
  if (c.name == "cosine") {
    // total_steps 0 is the run's length, known once the data is loaded (SetRunLength).
    if (c.total_steps < 0 || c.min_lr < 0 || c.min_lr > base_lr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cosine schedule needs total_steps >= 0 (0: the run's length) and 0 <= "
                       "min_lr <= lr, got ",
                       c.total_steps, ", ", c.min_lr));
    }
    return LrSchedule(c, base_lr);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown lr scheduler '", c.name, "'; use none, step or cosine"));
}

double LrSchedule::LrAt(int64_t step) const {
  if (config_.name == "step") {
    return base_lr_ * std::pow(config_.gamma, static_cast<double>(step / config_.step_size));
  }
  if (config_.name == "cosine") {
    // As torch's CosineAnnealingLR with T_max = total_steps, held at min_lr afterwards. Before
    // the run's length is known no step has been taken: the base rate, not 0/0.
    if (config_.total_steps < 1) return base_lr_;
    const double t = std::min<double>(static_cast<double>(step), config_.total_steps);
    return config_.min_lr +
           (base_lr_ - config_.min_lr) * (1 + std::cos(M_PI * t / config_.total_steps)) / 2;
  }
  return base_lr_;
}

absl::Status LrSchedule::SetRunLength(int64_t total_steps) {
  if (total_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the run's length must be at least 1 optimizer step, got ", total_steps));
  }
  config_.total_steps = total_steps;
  return absl::OkStatus();
}

c10::IValue LrSchedule::StateDict(int64_t step) const {
  if (config_.name != "step" && config_.name != "cosine") return c10::IValue();
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  if (config_.name == "step") {
    d.insert("step_size", config_.step_size);
    d.insert("gamma", config_.gamma);
  } else {
    d.insert("T_max", config_.total_steps);
    d.insert("eta_min", config_.min_lr);
  }
  c10::impl::GenericList base(c10::FloatType::get());
  base.push_back(base_lr_);
  c10::impl::GenericList last(c10::FloatType::get());
  last.push_back(LrAt(step));
  d.insert("base_lrs", base);
  d.insert("last_epoch", step);
  d.insert("_step_count", step + 1);
  d.insert("verbose", false);
  d.insert("_get_lr_called_within_step", false);
  d.insert("_last_lr", last);
  return d;
}

void LrSchedule::Apply(torch::optim::Optimizer& optimizer, int64_t step) const {
  const double lr = LrAt(step);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace dtrain

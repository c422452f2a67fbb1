#include "worker/model/optimizers.h"

#include <cmath>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    std::vector<torch::Tensor> parameters, const OptimizerConfig& c) {
  for (const absl::Status& s : {
           Check(c.lr > 0 && std::isfinite(c.lr),
                 absl::StrCat("optimizer lr must be > 0, got ", c.lr)),
           Check(c.momentum >= 0 && c.momentum < 1,
                 absl::StrCat("optimizer momentum must be in [0, 1), got ", c.momentum)),
           Check(c.weight_decay >= 0,
                 absl::StrCat("optimizer weight_decay must be >= 0, got ", c.weight_decay)),
           Check(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
                 absl::StrCat("optimizer betas must be in [0, 1), got ", c.beta1, ", ", c.beta2)),
           Check(c.eps > 0, absl::StrCat("optimizer eps must be > 0, got ", c.eps)),
       }) {
    if (!s.ok()) return s;
  }
  if (c.name == "sgd") {
    if (c.nesterov && c.momentum <= 0) {
      return absl::InvalidArgumentError("sgd: nesterov needs momentum > 0 (as in torch)");
    }
    return std::unique_ptr<torch::optim::Optimizer>(
        new torch::optim::SGD(std::move(parameters), torch::optim::SGDOptions(c.lr)
                                                         .momentum(c.momentum)
                                                         .nesterov(c.nesterov)
                                                         .weight_decay(c.weight_decay)));
  }
  if (c.name == "adam") {
    return std::unique_ptr<torch::optim::Optimizer>(
        new torch::optim::Adam(std::move(parameters), torch::optim::AdamOptions(c.lr)
                                                          .betas({c.beta1, c.beta2})
                                                          .eps(c.eps)
                                                          .weight_decay(c.weight_decay)));
  }
  if (c.name == "adamw") {
    return std::unique_ptr<torch::optim::Optimizer>(
        new torch::optim::AdamW(std::move(parameters), torch::optim::AdamWOptions(c.lr)
                                                           .betas({c.beta1, c.beta2})
                                                           .eps(c.eps)
                                                           .weight_decay(c.weight_decay)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", c.name, "'; use sgd, adam or adamw"));
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

#include "worker/model/chainable_lr_schedulers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/lr_scheduler_support.h"

namespace dtrain {
namespace lr_scheduling {
namespace {

// torch's _LRScheduler: base_lrs, last_epoch, _step_count and the chainable step().
class Chainable : public LrScheduler {
 public:
  explicit Chainable(std::string kind) : kind_(std::move(kind)) {}

  // __init__(optimizer, last_epoch=-1): each group's initial_lr (the first scheduler's),
  // base_lrs from them, then the initial step.
  absl::Status Construct(ScheduledGroups& groups) {
    base_lrs_.clear();
    for (ScheduledGroup& g : groups) {
      if (!g.initial_lr.has_value()) g.initial_lr = g.lr;
      base_lrs_.push_back(*g.initial_lr);
    }
    last_epoch_ = -1;
    return InitialStep(groups);
  }
  absl::Status InitialStep(ScheduledGroups& groups) override {
    step_count_ = 0;
    return Step(groups, std::nullopt);
  }
  absl::Status Step(ScheduledGroups& groups, std::optional<double>) override {
    ++step_count_;
    ++last_epoch_;
    DTRAIN_ASSIGN_OR_RETURN(std::vector<double> values, GetLr(groups));
    Apply(groups, values);
    return absl::OkStatus();
  }
  absl::Status StepAtZero(ScheduledGroups& groups) override {
    ++step_count_;
    last_epoch_ = 0;
    std::optional<std::vector<double>> closed = ClosedForm();
    if (closed.has_value()) {
      Apply(groups, *closed);
      return absl::OkStatus();
    }
    DTRAIN_ASSIGN_OR_RETURN(std::vector<double> values, GetLr(groups));
    Apply(groups, values);
    return absl::OkStatus();
  }
  void RewindOne() override { --last_epoch_; }

  c10::IValue StateDict() const override {
    PyDict d = NewDict();
    AddOwnState(d);
    d.insert("base_lrs", FloatList(base_lrs_));
    d.insert("last_epoch", last_epoch_);
    d.insert("verbose", false);
    d.insert("_step_count", step_count_);
    d.insert("_get_lr_called_within_step", false);
    d.insert("_last_lr", FloatList(last_lr_));
    return d;
  }
  absl::Status LoadStateDict(const c10::IValue& state) override {
    StateReader r(state, absl::StrCat("lr_schedulers entry of ", kind_));
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(kind_, " state is not a dict"));
    DTRAIN_RETURN_IF_ERROR(r.Int("last_epoch", &last_epoch_));
    DTRAIN_RETURN_IF_ERROR(r.Int("_step_count", &step_count_));
    DTRAIN_RETURN_IF_ERROR(r.Doubles("base_lrs", &base_lrs_, base_lrs_.size()));
    if (r.Get("_last_lr").ok()) {
      DTRAIN_RETURN_IF_ERROR(r.Doubles("_last_lr", &last_lr_, base_lrs_.size()));
    }
    return LoadOwnState(r);
  }

 protected:
  virtual absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& groups) = 0;
  virtual std::optional<std::vector<double>> ClosedForm() const { return std::nullopt; }
  virtual void AddOwnState(PyDict&) const {}
  virtual absl::Status LoadOwnState(const StateReader&) { return absl::OkStatus(); }

  // f(base_lr) per group: torch's closed forms.
  template <typename F>
  std::vector<double> FromBase(F f) const {
    std::vector<double> out;
    for (double b : base_lrs_) out.push_back(f(b));
    return out;
  }
  static std::vector<double> Lrs(const ScheduledGroups& groups, double factor = 1.0) {
    std::vector<double> out;
    for (const ScheduledGroup& g : groups) out.push_back(g.lr * factor);
    return out;
  }
  void Apply(ScheduledGroups& groups, const std::vector<double>& values) {
    for (size_t i = 0; i < groups.size() && i < values.size(); ++i) groups[i].lr = values[i];
    last_lr_ = Lrs(groups);
  }

  std::string kind_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
};

class StepLR : public Chainable {
 public:
  StepLR(int64_t step_size, double gamma)
      : Chainable("StepLR"), step_size_(step_size), gamma_(gamma) {}

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return Lrs(g);
    return Lrs(g, gamma_);
  }
  std::optional<std::vector<double>> ClosedForm() const override {
    return FromBase([&](double b) {
      return b * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_));
    });
  }
  void AddOwnState(PyDict& d) const override {
    d.insert("step_size", step_size_);
    d.insert("gamma", gamma_);
  }

 private:
  int64_t step_size_;
  double gamma_;
};

class MultiStepLR : public Chainable {
 public:
  MultiStepLR(std::vector<int64_t> milestones, double gamma)
      : Chainable("MultiStepLR"), gamma_(gamma) {
    for (int64_t m : milestones) ++counts_[m];
  }

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    auto it = counts_.find(last_epoch_);
    if (it == counts_.end()) return Lrs(g);
    return Lrs(g, std::pow(gamma_, static_cast<double>(it->second)));
  }
  std::optional<std::vector<double>> ClosedForm() const override {
    int64_t passed = 0;  // bisect_right over the sorted milestones, with repeats
    for (const auto& [m, n] : counts_) {
      if (m <= last_epoch_) passed += n;
    }
    return FromBase([&](double b) { return b * std::pow(gamma_, static_cast<double>(passed)); });
  }
  void AddOwnState(PyDict& d) const override {
    // torch keeps a collections.Counter; a dict of the same counts reads back the same.
    c10::impl::GenericDict counts(c10::IntType::get(), c10::IntType::get());
    for (const auto& [m, n] : counts_) counts.insert(m, n);
    d.insert("milestones", counts);
    d.insert("gamma", gamma_);
  }

 private:
  std::map<int64_t, int64_t> counts_;
  double gamma_;
};

class ConstantLR : public Chainable {
 public:
  ConstantLR(double factor, int64_t total_iters)
      : Chainable("ConstantLR"), factor_(factor), total_iters_(total_iters) {}

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    if (last_epoch_ == 0) return Lrs(g, factor_);
    if (last_epoch_ != total_iters_) return Lrs(g);
    return Lrs(g, 1.0 / factor_);
  }
  std::optional<std::vector<double>> ClosedForm() const override {
    return FromBase([&](double b) {
      return b * (factor_ + (last_epoch_ >= total_iters_ ? 1.0 : 0.0) * (1 - factor_));
    });
  }
  void AddOwnState(PyDict& d) const override {
    d.insert("factor", factor_);
    d.insert("total_iters", total_iters_);
  }

 private:
  double factor_;
  int64_t total_iters_;
};

class LinearLR : public Chainable {
 public:
  LinearLR(double start, double end, int64_t total_iters)
      : Chainable("LinearLR"), start_(start), end_(end), total_iters_(total_iters) {}

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    if (last_epoch_ == 0) return Lrs(g, start_);
    if (last_epoch_ > total_iters_) return Lrs(g);
    return Lrs(g, 1. + (end_ - start_) / (static_cast<double>(total_iters_) * start_ +
                                          static_cast<double>(last_epoch_ - 1) * (end_ - start_)));
  }
  std::optional<std::vector<double>> ClosedForm() const override {
    const double t = static_cast<double>(std::min(total_iters_, last_epoch_));
    return FromBase([&](double b) {
      return b * (start_ + (end_ - start_) * t / static_cast<double>(total_iters_));
    });
  }
  void AddOwnState(PyDict& d) const override {
    d.insert("start_factor", start_);
    d.insert("end_factor", end_);
    d.insert("total_iters", total_iters_);
  }

 private:
  double start_, end_;
  int64_t total_iters_;
};

class ExponentialLR : public Chainable {
 public:
  explicit ExponentialLR(double gamma) : Chainable("ExponentialLR"), gamma_(gamma) {}

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    if (last_epoch_ == 0) return Lrs(g);
    return Lrs(g, gamma_);
  }
  std::optional<std::vector<double>> ClosedForm() const override {
    return FromBase(
        [&](double b) { return b * std::pow(gamma_, static_cast<double>(last_epoch_)); });
  }
  void AddOwnState(PyDict& d) const override { d.insert("gamma", gamma_); }

 private:
  double gamma_;
};

class CosineAnnealingLR : public Chainable {
 public:
  CosineAnnealingLR(double t_max, double eta_min)
      : Chainable("CosineAnnealingLR"), t_max_(t_max), eta_min_(eta_min) {}

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    const double e = static_cast<double>(last_epoch_);
    std::vector<double> out;
    if (last_epoch_ == 0) return Lrs(g);
    if (step_count_ == 1 && last_epoch_ > 0) {
      return FromBase([&](double b) {
        return eta_min_ + (b - eta_min_) * (1 + std::cos(e * M_PI / t_max_)) / 2;
      });
    }
    if (PyMod(e - 1 - t_max_, 2 * t_max_) == 0) {
      for (size_t i = 0; i < g.size(); ++i) {
        out.push_back(g[i].lr + (base_lrs_[i] - eta_min_) * (1 - std::cos(M_PI / t_max_)) / 2);
      }
      return out;
    }
    for (const ScheduledGroup& group : g) {
      out.push_back((1 + std::cos(M_PI * e / t_max_)) / (1 + std::cos(M_PI * (e - 1) / t_max_)) *
                        (group.lr - eta_min_) +
                    eta_min_);
    }
    return out;
  }
  std::optional<std::vector<double>> ClosedForm() const override {
    return FromBase([&](double b) {
      return eta_min_ +
             (b - eta_min_) * (1 + std::cos(M_PI * static_cast<double>(last_epoch_) / t_max_)) / 2;
    });
  }
  void AddOwnState(PyDict& d) const override {
    d.insert("T_max", Number(t_max_));
    d.insert("eta_min", Number(eta_min_));
  }

 private:
  double t_max_, eta_min_;
};

class LambdaLR : public Chainable {
 public:
  LambdaLR(LrLambda lambda, std::vector<std::string> methods)
      : Chainable("LambdaLR"), lambda_(std::move(lambda)), methods_(std::move(methods)) {}

 protected:
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups&) override {
    std::vector<double> out;
    for (size_t i = 0; i < base_lrs_.size(); ++i) {
      DTRAIN_ASSIGN_OR_RETURN(double factor, lambda_(methods_[i], last_epoch_));
      out.push_back(base_lrs_[i] * factor);
    }
    return out;
  }
  void AddOwnState(PyDict& d) const override {
    // torch writes None for each plain function (only callable objects have state).
    c10::impl::GenericList none(c10::AnyType::get());
    for (size_t i = 0; i < base_lrs_.size(); ++i) none.push_back(c10::IValue());
    d.insert("lr_lambdas", none);
  }

 private:
  LrLambda lambda_;
  std::vector<std::string> methods_;
};

class OneCycleLR : public Chainable {
 public:
  struct Phase {
    double end_step;
    double ScheduledGroup::*start_lr;
    double ScheduledGroup::*end_lr;
    double ScheduledGroup::*start_momentum;
    double ScheduledGroup::*end_momentum;
    const char* names[4];
  };
  OneCycleLR(const v1::SchedulerRecipe& r, bool has_momentum)
      : Chainable("OneCycleLR"),
        total_steps_(r.total_steps()),
        cos_(r.anneal_strategy() != "linear"),
        cycle_momentum_(r.cycle_momentum() && has_momentum) {
    const double t = static_cast<double>(total_steps_);
    const double p = r.pct_start();
    // initial_lr is a separate field of the group: the start and end rates of a phase.
    if (r.three_phase()) {
      phases_ = {
          {p * t - 1,
           &ScheduledGroup::min_lr,
           &ScheduledGroup::max_lr,
           &ScheduledGroup::max_momentum,
           &ScheduledGroup::base_momentum,
           {"initial_lr", "max_lr", "max_momentum", "base_momentum"}},
          {2 * p * t - 2,
           &ScheduledGroup::max_lr,
           &ScheduledGroup::min_lr,
           &ScheduledGroup::base_momentum,
           &ScheduledGroup::max_momentum,
           {"max_lr", "initial_lr", "base_momentum", "max_momentum"}},
          {t - 1,
           &ScheduledGroup::min_lr,
           &ScheduledGroup::min_lr,
           &ScheduledGroup::max_momentum,
           &ScheduledGroup::max_momentum,
           {"initial_lr", "min_lr", "max_momentum", "max_momentum"}},
      };
      uses_initial_ = {{true, false}, {false, true}, {true, false}};
    } else {
      phases_ = {
          {p * t - 1,
           &ScheduledGroup::min_lr,
           &ScheduledGroup::max_lr,
           &ScheduledGroup::max_momentum,
           &ScheduledGroup::base_momentum,
           {"initial_lr", "max_lr", "max_momentum", "base_momentum"}},
          {t - 1,
           &ScheduledGroup::max_lr,
           &ScheduledGroup::min_lr,
           &ScheduledGroup::base_momentum,
           &ScheduledGroup::max_momentum,
           {"max_lr", "min_lr", "base_momentum", "max_momentum"}},
      };
      uses_initial_ = {{true, false}, {false, false}};
    }
  }

 protected:
  double Anneal(double start, double end, double pct) const {
    if (cos_) return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1);
    return (end - start) * pct + start;
  }
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups& g) override {
    if (last_epoch_ > total_steps_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "OneCycleLR: tried to step ", last_epoch_, " times; its total_steps is ", total_steps_,
          " (torch raises here too): give OneCycleLR the run's optimizer steps, "
          "total_steps=self.trainer.estimated_stepping_batches is not available in dtrain"));
    }
    const double step = static_cast<double>(last_epoch_);
    std::vector<double> out;
    momenta_.clear();
    for (const ScheduledGroup& group : g) {
      double start_step = 0, lr = 0, momentum = 0;
      for (size_t i = 0; i < phases_.size(); ++i) {
        const Phase& phase = phases_[i];
        if (step <= phase.end_step || i + 1 == phases_.size()) {
          const double pct = (step - start_step) / (phase.end_step - start_step);
          const double from = uses_initial_[i].first ? *group.initial_lr : group.*phase.start_lr;
          const double to = uses_initial_[i].second ? *group.initial_lr : group.*phase.end_lr;
          lr = Anneal(from, to, pct);
          momentum = Anneal(group.*phase.start_momentum, group.*phase.end_momentum, pct);
          break;
        }
        start_step = phase.end_step;
      }
      out.push_back(lr);
      momenta_.push_back(momentum);
    }
    return out;
  }
  absl::Status Step(ScheduledGroups& groups, std::optional<double> metric) override {
    DTRAIN_RETURN_IF_ERROR(Chainable::Step(groups, metric));
    if (cycle_momentum_) {
      for (size_t i = 0; i < groups.size() && i < momenta_.size(); ++i) {
        groups[i].momentum = momenta_[i];
      }
    }
    return absl::OkStatus();
  }
  void AddOwnState(PyDict& d) const override {
    d.insert("total_steps", total_steps_);
    c10::impl::GenericList phases(c10::AnyType::get());
    for (const Phase& p : phases_) {
      PyDict phase = NewDict();
      phase.insert("end_step", p.end_step);
      phase.insert("start_lr", std::string(p.names[0]));
      phase.insert("end_lr", std::string(p.names[1]));
      phase.insert("start_momentum", std::string(p.names[2]));
      phase.insert("end_momentum", std::string(p.names[3]));
      phases.push_back(phase);
    }
    d.insert("_schedule_phases", phases);
    // torch keeps the bound anneal function here; its name is what can travel.
    d.insert("anneal_strategy", std::string(cos_ ? "cos" : "linear"));
    d.insert("cycle_momentum", cycle_momentum_);
    if (cycle_momentum_) d.insert("use_beta1", use_beta1_);
  }

 public:
  bool use_beta1_ = false;

 private:
  int64_t total_steps_;
  bool cos_;
  bool cycle_momentum_;
  std::vector<Phase> phases_;
  std::vector<std::pair<bool, bool>> uses_initial_;
  std::vector<double> momenta_;
};

// torch's CosineAnnealingWarmRestarts overrides step(): T_cur and T_i instead of a chain, and
// its _step_count stays 0.
class CosineAnnealingWarmRestarts : public Chainable {
 public:
  CosineAnnealingWarmRestarts(int64_t t0, int64_t t_mult, double eta_min)
      : Chainable("CosineAnnealingWarmRestarts"),
        t0_(t0),
        t_i_(static_cast<double>(t0)),
        t_mult_(t_mult),
        eta_min_(eta_min) {}

  absl::Status InitialStep(ScheduledGroups& groups) override {
    step_count_ = 0;
    return Step(groups, std::nullopt);
  }
  absl::Status Step(ScheduledGroups& groups, std::optional<double>) override {
    if (last_epoch_ < 0) return StepTo(groups, 0);
    t_cur_ += 1;
    if (t_cur_ >= t_i_) {
      t_cur_ -= t_i_;
      t_i_ *= static_cast<double>(t_mult_);
    }
    last_epoch_ += 1;
    return Set(groups);
  }
  absl::Status StepAtZero(ScheduledGroups& groups) override { return StepTo(groups, 0); }

 protected:
  absl::Status StepTo(ScheduledGroups& groups, int64_t epoch) {
    // Only epoch 0 reaches here (the first step, SequentialLR's milestone): T_0 > 0.
    t_i_ = static_cast<double>(t0_);
    t_cur_ = static_cast<double>(epoch);
    last_epoch_ = epoch;
    return Set(groups);
  }
  absl::Status Set(ScheduledGroups& groups) {
    DTRAIN_ASSIGN_OR_RETURN(std::vector<double> values, GetLr(groups));
    Apply(groups, values);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> GetLr(const ScheduledGroups&) override {
    return FromBase([&](double b) {
      return eta_min_ + (b - eta_min_) * (1 + std::cos(M_PI * t_cur_ / t_i_)) / 2;
    });
  }
  void AddOwnState(PyDict& d) const override {
    d.insert("T_0", t0_);
    d.insert("T_i", Number(t_i_));
    d.insert("T_mult", t_mult_);
    d.insert("eta_min", Number(eta_min_));
    d.insert("T_cur", Number(t_cur_));
  }
  absl::Status LoadOwnState(const StateReader& r) override {
    DTRAIN_RETURN_IF_ERROR(r.Double("T_i", &t_i_));
    return r.Double("T_cur", &t_cur_);
  }

 private:
  int64_t t0_;
  double t_i_;
  int64_t t_mult_;
  double eta_min_;
  double t_cur_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LrScheduler>> MakeChainable(const v1::SchedulerRecipe& r,
                                                           ScheduledGroups& groups,
                                                           const OptimizerConfig& optimizer,
                                                           const LrLambda& lambda) {
  const std::string& k = r.kind();
  auto construct =
      [&](std::unique_ptr<Chainable> s) -> absl::StatusOr<std::unique_ptr<LrScheduler>> {
    DTRAIN_RETURN_IF_ERROR(s->Construct(groups));
    return std::unique_ptr<LrScheduler>(std::move(s));
  };
  if (k == "StepLR") {
    DTRAIN_RETURN_IF_ERROR(Require(r.step_size() >= 1, k, "needs step_size >= 1"));
    return construct(std::make_unique<StepLR>(r.step_size(), r.gamma()));
  }
  if (k == "MultiStepLR") {
    return construct(std::make_unique<MultiStepLR>(
        std::vector<int64_t>(r.milestones().begin(), r.milestones().end()), r.gamma()));
  }
  if (k == "ConstantLR") {
    DTRAIN_RETURN_IF_ERROR(Require(r.factor() > 0 && r.factor() <= 1 && r.total_iters() >= 0, k,
                                   "needs 0 < factor <= 1 and total_iters >= 0"));
    return construct(std::make_unique<ConstantLR>(r.factor(), r.total_iters()));
  }
  if (k == "LinearLR") {
    DTRAIN_RETURN_IF_ERROR(Require(r.start_factor() > 0 && r.start_factor() <= 1 &&
                                       r.end_factor() >= 0 && r.end_factor() <= 1 &&
                                       r.total_iters() >= 1,
                                   k,
                                   "needs 0 < start_factor <= 1, 0 <= end_factor <= 1 and "
                                   "total_iters >= 1"));
    return construct(std::make_unique<LinearLR>(r.start_factor(), r.end_factor(), r.total_iters()));
  }
  if (k == "ExponentialLR") return construct(std::make_unique<ExponentialLR>(r.gamma()));
  if (k == "CosineAnnealingLR") {
    DTRAIN_RETURN_IF_ERROR(Require(r.t_max() > 0, k, "needs T_max > 0"));
    return construct(std::make_unique<CosineAnnealingLR>(r.t_max(), r.eta_min()));
  }
  if (k == "CosineAnnealingWarmRestarts") {
    DTRAIN_RETURN_IF_ERROR(
        Require(r.t_0() >= 1 && r.t_mult() >= 1, k, "needs T_0 >= 1 and T_mult >= 1"));
    return construct(
        std::make_unique<CosineAnnealingWarmRestarts>(r.t_0(), r.t_mult(), r.eta_min()));
  }
  if (k == "LambdaLR") {
    DTRAIN_RETURN_IF_ERROR(Require(static_cast<size_t>(r.lr_lambda_size()) == groups.size(), k,
                                   "needs one exported lr_lambda method per param group"));
    if (!lambda) return Require(false, k, "needs a model to call its lr_lambda methods");
    return construct(std::make_unique<LambdaLR>(
        lambda, std::vector<std::string>(r.lr_lambda().begin(), r.lr_lambda().end())));
  }
  if (k == "OneCycleLR") {
    DTRAIN_RETURN_IF_ERROR(Require(r.total_steps() >= 1 && r.pct_start() > 0 && r.pct_start() < 1 &&
                                       r.div_factor() > 0 && r.final_div_factor() > 0,
                                   k,
                                   "needs total_steps >= 1, 0 < pct_start < 1 and positive "
                                   "div_factor and final_div_factor"));
    DTRAIN_ASSIGN_OR_RETURN(std::vector<double> max_lrs,
                            PerGroup(r.max_lr(), groups.size(), k, "max_lr"));
    const bool has_momentum = optimizer.name != "adagrad";
    if (r.cycle_momentum() && !has_momentum) {
      return Require(false, k, "cycle_momentum needs an optimizer with momentum or betas");
    }
    std::vector<double> base(groups.size()), top(groups.size());
    if (r.cycle_momentum()) {
      DTRAIN_ASSIGN_OR_RETURN(base, PerGroup(r.base_momentum(), groups.size(), k, "base_momentum"));
      DTRAIN_ASSIGN_OR_RETURN(top, PerGroup(r.max_momentum(), groups.size(), k, "max_momentum"));
    }
    std::vector<double> initial(groups.size()), lowest(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      initial[i] = max_lrs[i] / r.div_factor();
      lowest[i] = initial[i] / r.final_div_factor();
    }
    if (!r.initial_lr().empty()) {
      DTRAIN_ASSIGN_OR_RETURN(initial, PerGroup(r.initial_lr(), groups.size(), k, "initial_lr"));
      DTRAIN_ASSIGN_OR_RETURN(lowest, PerGroup(r.min_lr(), groups.size(), k, "min_lr"));
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      ScheduledGroup& g = groups[i];
      g.initial_lr = initial[i];
      g.max_lr = max_lrs[i];
      g.min_lr = lowest[i];
      g.one_cycle = true;
      if (r.cycle_momentum()) {
        g.momentum = top[i];
        g.max_momentum = top[i];
        g.base_momentum = base[i];
      }
    }
    auto s = std::make_unique<OneCycleLR>(r, has_momentum);
    s->use_beta1_ = optimizer.name == "adam" || optimizer.name == "adamw";
    return construct(std::move(s));
  }
  return Require(false, k, "is not a chainable scheduler");
}

}  // namespace lr_scheduling

bool IsChainableLrScheduler(const std::string& kind) {
  static const char* const kKinds[] = {"StepLR",
                                       "MultiStepLR",
                                       "ConstantLR",
                                       "LinearLR",
                                       "ExponentialLR",
                                       "CosineAnnealingLR",
                                       "CosineAnnealingWarmRestarts",
                                       "LambdaLR",
                                       "OneCycleLR"};
  return std::find(std::begin(kKinds), std::end(kKinds), kind) != std::end(kKinds);
}

absl::StatusOr<std::unique_ptr<LrScheduler>> MakeChainableLrScheduler(
    const v1::SchedulerRecipe& r, ScheduledGroups& groups, const OptimizerConfig& optimizer,
    const LrLambda& lambda) {
  return lr_scheduling::MakeChainable(r, groups, optimizer, lambda);
}

}  // namespace dtrain

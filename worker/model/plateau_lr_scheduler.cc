#include "worker/model/plateau_lr_scheduler.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/lr_scheduler_support.h"

namespace dtrain {
namespace lr_scheduling {
namespace {

class ReduceLROnPlateau : public LrScheduler {
 public:
  ReduceLROnPlateau(const v1::SchedulerRecipe& r, std::vector<double> min_lrs)
      : factor_(r.factor()),
        min_lrs_(std::move(min_lrs)),
        patience_(r.patience()),
        cooldown_(r.cooldown()),
        mode_(r.mode()),
        threshold_(r.threshold()),
        threshold_mode_(r.threshold_mode()),
        eps_(r.eps()) {
    mode_worse_ = mode_ == "min" ? std::numeric_limits<double>::infinity()
                                 : -std::numeric_limits<double>::infinity();
    best_ = mode_worse_;
  }

  absl::Status Step(ScheduledGroups& groups, std::optional<double> metric) override {
    if (!metric.has_value()) {
      return absl::InternalError("ReduceLROnPlateau stepped without its monitored value");
    }
    const double current = *metric;
    last_epoch_ += 1;
    if (IsBetter(current)) {
      best_ = current;
      num_bad_epochs_ = 0;
    } else {
      num_bad_epochs_ += 1;
    }
    if (cooldown_counter_ > 0) {
      cooldown_counter_ -= 1;
      num_bad_epochs_ = 0;
    }
    if (num_bad_epochs_ > patience_) {
      for (size_t i = 0; i < groups.size(); ++i) {
        const double old_lr = groups[i].lr;
        const double new_lr = std::max(old_lr * factor_, min_lrs_[i]);
        if (old_lr - new_lr > eps_) groups[i].lr = new_lr;
      }
      cooldown_counter_ = cooldown_;
      num_bad_epochs_ = 0;
    }
    last_lr_.clear();
    for (const ScheduledGroup& g : groups) last_lr_.push_back(g.lr);
    return absl::OkStatus();
  }
  absl::Status InitialStep(ScheduledGroups&) override { return absl::OkStatus(); }
  c10::IValue StateDict() const override {
    PyDict d = NewDict();
    d.insert("factor", factor_);
    d.insert("min_lrs", FloatList(min_lrs_));
    d.insert("patience", patience_);
    d.insert("verbose", false);
    d.insert("cooldown", cooldown_);
    d.insert("cooldown_counter", cooldown_counter_);
    d.insert("mode", mode_);
    d.insert("threshold", threshold_);
    d.insert("threshold_mode", threshold_mode_);
    d.insert("best", best_);
    d.insert("num_bad_epochs", num_bad_epochs_);
    d.insert("mode_worse", mode_worse_);
    d.insert("eps", eps_);
    d.insert("last_epoch", last_epoch_);
    if (!last_lr_.empty()) d.insert("_last_lr", FloatList(last_lr_));
    return d;
  }
  absl::Status LoadStateDict(const c10::IValue& state) override {
    StateReader r(state, "lr_schedulers entry of ReduceLROnPlateau");
    if (!r.ok()) return absl::InvalidArgumentError("ReduceLROnPlateau state is not a dict");
    DTRAIN_RETURN_IF_ERROR(r.Double("best", &best_));
    DTRAIN_RETURN_IF_ERROR(r.Int("num_bad_epochs", &num_bad_epochs_));
    DTRAIN_RETURN_IF_ERROR(r.Int("cooldown_counter", &cooldown_counter_));
    return r.Int("last_epoch", &last_epoch_);
  }

 private:
  bool IsBetter(double a) const {
    if (mode_ == "min" && threshold_mode_ == "rel") return a < best_ * (1. - threshold_);
    if (mode_ == "min") return a < best_ - threshold_;
    if (threshold_mode_ == "rel") return a > best_ * (threshold_ + 1.);
    return a > best_ + threshold_;
  }

  double factor_;
  std::vector<double> min_lrs_;
  int64_t patience_, cooldown_;
  std::string mode_;
  double threshold_;
  std::string threshold_mode_;
  double eps_;
  double best_, mode_worse_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LrScheduler>> MakePlateau(const v1::SchedulerRecipe& r,
                                                         size_t groups) {
  const std::string& k = r.kind();
  DTRAIN_RETURN_IF_ERROR(Require(r.factor() < 1 && r.factor() >= 0, k, "needs 0 <= factor < 1"));
  DTRAIN_RETURN_IF_ERROR(
      Require(r.mode() == "min" || r.mode() == "max", k, "mode must be min or max"));
  DTRAIN_RETURN_IF_ERROR(Require(r.threshold_mode() == "rel" || r.threshold_mode() == "abs", k,
                                 "threshold_mode must be rel or abs"));
  std::vector<double> min_lrs(groups, 0.0);
  if (!r.min_lr().empty()) {
    DTRAIN_ASSIGN_OR_RETURN(min_lrs, PerGroup(r.min_lr(), groups, k, "min_lr"));
  }
  return std::unique_ptr<LrScheduler>(std::make_unique<ReduceLROnPlateau>(r, min_lrs));
}

}  // namespace lr_scheduling

absl::StatusOr<std::unique_ptr<LrScheduler>> MakeReduceLROnPlateau(const v1::SchedulerRecipe& r,
                                                                   size_t groups) {
  return lr_scheduling::MakePlateau(r, groups);
}

}  // namespace dtrain

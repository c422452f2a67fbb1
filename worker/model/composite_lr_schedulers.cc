#include "worker/model/composite_lr_schedulers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/lr_scheduler_support.h"

namespace dtrain {
namespace lr_scheduling {
namespace {

// SequentialLR and ChainedScheduler: their children's state_dicts under "_schedulers".
class Composite : public LrScheduler {
 public:
  Composite(std::string kind, std::vector<std::unique_ptr<LrScheduler>> children,
            std::vector<int64_t> milestones)
      : kind_(std::move(kind)),
        children_(std::move(children)),
        milestones_(std::move(milestones)) {}

  bool sequential() const { return kind_ == "SequentialLR"; }

  // SequentialLR's __init__, after its children were made: rates back to initial_lr, every
  // child one step back, the first one's initial step.
  absl::Status Construct(ScheduledGroups& groups) {
    if (sequential()) {
      last_epoch_ = 0;
      for (ScheduledGroup& g : groups) g.lr = g.initial_lr.value_or(g.lr);
      for (auto& child : children_) child->RewindOne();
      DTRAIN_RETURN_IF_ERROR(children_.front()->InitialStep(groups));
    }
    last_lr_.clear();
    for (const ScheduledGroup& g : groups) last_lr_.push_back(g.lr);
    return absl::OkStatus();
  }
  absl::Status Step(ScheduledGroups& groups, std::optional<double> metric) override {
    if (!sequential()) {
      for (auto& child : children_) DTRAIN_RETURN_IF_ERROR(child->Step(groups, metric));
    } else {
      ++last_epoch_;
      const size_t idx = static_cast<size_t>(
          std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) -
          milestones_.begin());
      if (idx > 0 && milestones_[idx - 1] == last_epoch_) {
        DTRAIN_RETURN_IF_ERROR(children_[idx]->StepAtZero(groups));
      } else {
        DTRAIN_RETURN_IF_ERROR(children_[idx]->Step(groups, metric));
      }
    }
    last_lr_.clear();
    for (const ScheduledGroup& g : groups) last_lr_.push_back(g.lr);
    return absl::OkStatus();
  }
  c10::IValue StateDict() const override {
    PyDict d = NewDict();
    if (sequential()) {
      c10::impl::GenericList milestones(c10::IntType::get());
      for (int64_t m : milestones_) milestones.push_back(m);
      d.insert("_milestones", milestones);
      d.insert("last_epoch", last_epoch_);
    }
    d.insert("_last_lr", FloatList(last_lr_));
    c10::impl::GenericList children(c10::AnyType::get());
    for (const auto& child : children_) children.push_back(child->StateDict());
    d.insert("_schedulers", children);
    return d;
  }
  absl::Status LoadStateDict(const c10::IValue& state) override {
    StateReader r(state, absl::StrCat("lr_schedulers entry of ", kind_));
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(kind_, " state is not a dict"));
    if (sequential()) DTRAIN_RETURN_IF_ERROR(r.Int("last_epoch", &last_epoch_));
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue children, r.Get("_schedulers"));
    if (!children.isList() || children.toListRef().size() != children_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kind_, " state's '_schedulers' is not a list of ", children_.size(), " states"));
    }
    for (size_t i = 0; i < children_.size(); ++i) {
      DTRAIN_RETURN_IF_ERROR(children_[i]->LoadStateDict(children.toListRef()[i]));
    }
    return absl::OkStatus();
  }

 private:
  std::string kind_;
  std::vector<std::unique_ptr<LrScheduler>> children_;
  std::vector<int64_t> milestones_;
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace
}  // namespace lr_scheduling

absl::StatusOr<std::unique_ptr<LrScheduler>> MakeCompositeLrScheduler(
    const std::string& kind, std::vector<std::unique_ptr<LrScheduler>> children,
    std::vector<int64_t> milestones, ScheduledGroups& groups) {
  auto composite =
      std::make_unique<lr_scheduling::Composite>(kind, std::move(children), std::move(milestones));
  DTRAIN_RETURN_IF_ERROR(composite->Construct(groups));
  return std::unique_ptr<LrScheduler>(std::move(composite));
}

}  // namespace dtrain

#include "worker/model/lr_schedulers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/model/chainable_lr_schedulers.h"
#include "worker/model/composite_lr_schedulers.h"
#include "worker/model/lr_scheduler_support.h"
#include "worker/model/plateau_lr_scheduler.h"

namespace dtrain {
namespace {

// Makes the scheduler `r` over `groups` as its torch constructor does, initial step included.
absl::StatusOr<std::unique_ptr<LrScheduler>> MakeOne(const v1::SchedulerRecipe& r,
                                                     ScheduledGroups& groups,
                                                     const OptimizerConfig& optimizer,
                                                     const LrLambda& lambda, int depth) {
  const std::string& k = r.kind();
  if (depth > 4) return lr_scheduling::Require(false, k, "nests schedulers more than 4 deep");
  if (IsChainableLrScheduler(k)) return MakeChainableLrScheduler(r, groups, optimizer, lambda);
  if (k == "ReduceLROnPlateau") return MakeReduceLROnPlateau(r, groups.size());
  if (k == "SequentialLR" || k == "ChainedScheduler") {
    DTRAIN_RETURN_IF_ERROR(lr_scheduling::Require(!r.schedulers().empty(), k, "has no schedulers"));
    if (k == "SequentialLR") {
      DTRAIN_RETURN_IF_ERROR(lr_scheduling::Require(r.milestones_size() + 1 == r.schedulers_size(),
                                                    k,
                                                    "needs one milestone fewer than schedulers"));
    }
    std::vector<std::unique_ptr<LrScheduler>> children;
    for (const v1::SchedulerRecipe& child : r.schedulers()) {
      if (child.kind() == "ReduceLROnPlateau") {
        return lr_scheduling::Require(false, k,
                                      "cannot hold ReduceLROnPlateau (torch's cannot either)");
      }
      DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<LrScheduler> made,
                              MakeOne(child, groups, optimizer, lambda, depth + 1));
      children.push_back(std::move(made));
    }
    return MakeCompositeLrScheduler(
        k, std::move(children), std::vector<int64_t>(r.milestones().begin(), r.milestones().end()),
        groups);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("configure_optimizers: lr scheduler ", k,
                   " is not supported; use StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, "
                   "CosineAnnealingWarmRestarts, OneCycleLR, LinearLR, ConstantLR, SequentialLR, "
                   "ChainedScheduler, ReduceLROnPlateau or LambdaLR"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LrSchedulers>> LrSchedulers::Make(
    const google::protobuf::RepeatedPtrField<v1::SchedulerRecipe>& recipes,
    const OptimizerConfig& optimizer, LrLambda lambda) {
  auto made = std::unique_ptr<LrSchedulers>(new LrSchedulers());
  const bool has_momentum = optimizer.name != "adagrad";
  const bool betas = optimizer.name == "adam" || optimizer.name == "adamw";
  auto add_group = [&](const OptimizerConfig& o) {
    ScheduledGroup g;
    g.lr = o.lr;
    if (has_momentum) g.momentum = betas ? o.beta1 : o.momentum;
    made->groups_.push_back(g);
  };
  if (optimizer.groups.empty()) add_group(optimizer);
  for (const ParamGroupConfig& group : optimizer.groups) add_group(group.options);
  for (const v1::SchedulerRecipe& r : recipes) {
    Entry entry;
    entry.kind = r.kind();
    if (r.interval() != "" && r.interval() != "step" && r.interval() != "epoch") {
      return absl::InvalidArgumentError(absl::StrCat(
          "configure_optimizers: lr_scheduler interval must be 'step' or 'epoch', got '",
          r.interval(), "'"));
    }
    entry.epoch_interval = r.interval() != "step";
    entry.frequency = r.frequency() > 0 ? r.frequency() : 1;
    entry.monitor = r.monitor();
    entry.strict = r.strict();
    if (r.kind() == "ReduceLROnPlateau") {
      if (r.monitor().empty()) {
        return absl::InvalidArgumentError(
            "configure_optimizers: ReduceLROnPlateau needs a monitor: return {\"optimizer\": ..., "
            "\"lr_scheduler\": {\"scheduler\": ..., \"monitor\": \"val_loss\"}}");
      }
      if (!entry.epoch_interval) {
        return absl::InvalidArgumentError(
            "configure_optimizers: ReduceLROnPlateau with interval 'step' is not supported; use "
            "interval 'epoch' (it then steps after each validation)");
      }
    }
    DTRAIN_ASSIGN_OR_RETURN(entry.scheduler, MakeOne(r, made->groups_, optimizer, lambda, 0));
    made->entries_.push_back(std::move(entry));
  }
  return made;
}

std::vector<GroupRates> LrSchedulers::Rates() const {
  std::vector<GroupRates> out;
  for (const ScheduledGroup& g : groups_) out.push_back({g.lr, g.momentum});
  return out;
}

absl::Status LrSchedulers::AfterOptimizerStep(int64_t batch_idx, bool closes_epoch, int64_t epoch) {
  for (Entry& e : entries_) {
    if (e.kind == "ReduceLROnPlateau" || e.epoch_interval) continue;
    if ((batch_idx + 1) % e.frequency == 0) {
      DTRAIN_RETURN_IF_ERROR(e.scheduler->Step(groups_, std::nullopt));
    }
  }
  if (!closes_epoch) return absl::OkStatus();
  for (Entry& e : entries_) {
    if (e.kind == "ReduceLROnPlateau" || !e.epoch_interval) continue;
    if ((epoch + 1) % e.frequency == 0) {
      DTRAIN_RETURN_IF_ERROR(e.scheduler->Step(groups_, std::nullopt));
    }
  }
  return absl::OkStatus();
}

absl::Status LrSchedulers::StepPlateaus(int64_t epoch,
                                        const std::map<std::string, double>& monitored) {
  for (Entry& e : entries_) {
    if (e.kind != "ReduceLROnPlateau" || (epoch + 1) % e.frequency != 0) continue;
    auto it = monitored.find(e.monitor);
    if (it == monitored.end()) {
      if (!e.strict) continue;
      std::vector<std::string> names;
      for (const auto& [name, value] : monitored) names.push_back(name);
      return absl::FailedPreconditionError(absl::StrCat(
          "ReduceLROnPlateau conditioned on metric '", e.monitor, "' which is not available",
          names.empty() ? "" : absl::StrCat(" (available: ", absl::StrJoin(names, ", "), ")"),
          ": log it in validation_step, or set \"strict\": False in the lr_scheduler dict"));
    }
    DTRAIN_RETURN_IF_ERROR(e.scheduler->Step(groups_, it->second));
  }
  return absl::OkStatus();
}

std::vector<LrSchedulers::Monitor> LrSchedulers::PlateauMonitors() const {
  std::vector<Monitor> out;
  for (const Entry& e : entries_) {
    if (e.kind == "ReduceLROnPlateau") out.push_back({e.monitor, e.strict});
  }
  return out;
}

std::string LrSchedulers::Describe() const {
  std::vector<std::string> parts;
  for (const Entry& e : entries_) {
    std::string every = e.frequency == 1 ? "every " : absl::StrCat("every ", e.frequency, " ");
    std::string unit = e.epoch_interval ? "epoch" : "step";
    if (e.frequency > 1) unit += "s";
    parts.push_back(e.kind == "ReduceLROnPlateau"
                        ? absl::StrCat(e.kind, " on ", e.monitor, " ", every, unit)
                        : absl::StrCat(e.kind, " ", every, unit));
  }
  return absl::StrJoin(parts, ", ");
}

std::vector<c10::IValue> LrSchedulers::StateDicts() const {
  std::vector<c10::IValue> out;
  for (const Entry& e : entries_) out.push_back(e.scheduler->StateDict());
  return out;
}

absl::Status LrSchedulers::Load(const std::vector<c10::IValue>& states,
                                const ScheduledGroups& restored) {
  if (states.size() != entries_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint has ", states.size(),
                                                   " lr_schedulers; the model's "
                                                   "configure_optimizers has ",
                                                   entries_.size()));
  }
  for (size_t i = 0; i < states.size(); ++i) {
    DTRAIN_RETURN_IF_ERROR(entries_[i].scheduler->LoadStateDict(states[i]));
  }
  for (size_t i = 0; i < groups_.size() && i < restored.size(); ++i) {
    groups_[i].lr = restored[i].lr;
    if (restored[i].momentum.has_value() && groups_[i].momentum.has_value()) {
      groups_[i].momentum = restored[i].momentum;
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain

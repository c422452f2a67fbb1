// configure_optimizers' learning-rate schedulers (optimization.proto's SchedulerRecipe), stepped
// as Lightning steps them. Each scheduler reproduces its torch.optim.lr_scheduler class step for
// step: the recursive get_lr() torch uses (not a closed form), the construction steps that
// SequentialLR and ChainedScheduler compose, and the state_dict() keys, so that the rates equal
// torch's to rounding and a checkpoint's lr_schedulers entries are what torch writes and reads.
// libtorch 1.13's C++ API has only StepLR, hence this file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtrain/v1/optimization.pb.h"
#include "worker/model/optimizers.h"

namespace dtrain {

// A param group as torch's schedulers see it: its rates and the keys schedulers add to it.
struct ScheduledGroup {
  double lr = 0;
  std::optional<double> momentum;  // momentum, or Adam's first beta; none for Adagrad
  std::optional<double> initial_lr;
  // OneCycleLR's keys
  double max_lr = 0, min_lr = 0, base_momentum = 0, max_momentum = 0;
  bool one_cycle = false;
};
using ScheduledGroups = std::vector<ScheduledGroup>;

// One torch.optim.lr_scheduler object.
class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  // scheduler.step(); `metric` only for ReduceLROnPlateau. FAILED_PRECONDITION where torch
  // raises (OneCycleLR past its total_steps).
  virtual absl::Status Step(ScheduledGroups& groups, std::optional<double> metric) = 0;
  // SequentialLR's scheduler.step(0) at a milestone: the closed form at epoch 0.
  virtual absl::Status StepAtZero(ScheduledGroups& groups) { return Step(groups, std::nullopt); }
  virtual c10::IValue StateDict() const = 0;
  virtual absl::Status LoadStateDict(const c10::IValue& state) = 0;
  // SequentialLR's construction: last_epoch -= 1 and the first one's _initial_step().
  virtual void RewindOne() {}
  virtual absl::Status InitialStep(ScheduledGroups& groups) { return Step(groups, std::nullopt); }
};

// LambdaLR's factor: the model's exported method (SchedulerRecipe.lr_lambda) at `epoch`.
using LrLambda = std::function<absl::StatusOr<double>(const std::string& method, int64_t epoch)>;

// The job's schedulers with Lightning's lr_scheduler config around each (interval, frequency,
// monitor), over the optimizer's param groups.
class LrSchedulers {
 public:
  // Builds them in order, as configure_optimizers constructed them (each constructor's initial
  // step changes the groups' rates). INVALID_ARGUMENT names a scheduler or value dtrain lacks.
  static absl::StatusOr<std::unique_ptr<LrSchedulers>> Make(
      const google::protobuf::RepeatedPtrField<v1::SchedulerRecipe>& recipes,
      const OptimizerConfig& optimizer, LrLambda lambda);

  // The groups' current rates, which the optimizer must use for its next step.
  const ScheduledGroups& groups() const { return groups_; }
  std::vector<GroupRates> Rates() const;

  // After a batch that closed an accumulation window (`batch_idx` counts from the epoch's
  // start): the step-interval schedulers whose frequency divides batch_idx + 1 step; on the
  // epoch's last batch, then the epoch-interval ones whose frequency divides epoch + 1.
  absl::Status AfterOptimizerStep(int64_t batch_idx, bool closes_epoch, int64_t epoch);
  // After epoch `epoch`'s validation: the ReduceLROnPlateau schedulers step on their monitor's
  // value. A missing strict monitor is FAILED_PRECONDITION naming it and what was there.
  absl::Status StepPlateaus(int64_t epoch, const std::map<std::string, double>& monitored);

  struct Monitor {
    std::string name;
    bool strict = true;
  };
  std::vector<Monitor> PlateauMonitors() const;
  // One line for the job's log: "OneCycleLR every step, ReduceLROnPlateau on val_loss".
  std::string Describe() const;

  // Lightning's checkpoint "lr_schedulers": each top-level scheduler's state_dict().
  std::vector<c10::IValue> StateDicts() const;
  // Restores them, and the groups' rates from the checkpoint's param groups (`lrs`, with
  // `momenta` when the optimizer has one), as torch's load_state_dict does.
  absl::Status Load(const std::vector<c10::IValue>& states, const ScheduledGroups& restored);

 private:
  struct Entry {
    std::string kind;
    std::unique_ptr<LrScheduler> scheduler;
    bool epoch_interval = true;
    int64_t frequency = 1;
    std::string monitor;
    bool strict = true;
  };
  ScheduledGroups groups_;
  std::vector<Entry> entries_;
};

}  // namespace dtrain

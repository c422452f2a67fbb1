// torch's chainable schedulers (the _LRScheduler family: StepLR, MultiStepLR, ConstantLR,
// LinearLR, ExponentialLR, CosineAnnealingLR, LambdaLR, OneCycleLR and
// CosineAnnealingWarmRestarts), each its torch class step for step: the recursive get_lr(),
// the closed form SequentialLR uses at a milestone, and torch's state_dict() keys.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "dtrain/v1/optimization.pb.h"
#include "worker/model/lr_schedulers.h"

namespace dtrain {

// Whether `kind` is one of them.
bool IsChainableLrScheduler(const std::string& kind);

// Makes the scheduler `r` (a chainable kind) over `groups` as its torch constructor does,
// initial step included. INVALID_ARGUMENT names a value torch would refuse.
absl::StatusOr<std::unique_ptr<LrScheduler>> MakeChainableLrScheduler(
    const v1::SchedulerRecipe& r, ScheduledGroups& groups, const OptimizerConfig& optimizer,
    const LrLambda& lambda);

}  // namespace dtrain

// torch's ReduceLROnPlateau: steps on a monitored value after validation (patience,
// cooldown, threshold in rel or abs mode, min_lr per group), with torch's state_dict() keys.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "dtrain/v1/optimization.pb.h"
#include "worker/model/lr_schedulers.h"

namespace dtrain {

// INVALID_ARGUMENT for a factor, mode, threshold_mode or min_lr torch would refuse.
absl::StatusOr<std::unique_ptr<LrScheduler>> MakeReduceLROnPlateau(const v1::SchedulerRecipe& r,
                                                                   size_t groups);

}  // namespace dtrain

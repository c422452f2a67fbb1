// torch's SequentialLR and ChainedScheduler over schedulers already made: construction as
// torch's (SequentialLR rewinds its children and replays the first one's initial step), steps,
// and their children's state_dicts under "_schedulers".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/lr_schedulers.h"

namespace dtrain {

// `kind`: SequentialLR (switching at `milestones`, one fewer than `children`) or
// ChainedScheduler (every child each step).
absl::StatusOr<std::unique_ptr<LrScheduler>> MakeCompositeLrScheduler(
    const std::string& kind, std::vector<std::unique_ptr<LrScheduler>> children,
    std::vector<int64_t> milestones, ScheduledGroups& groups);

}  // namespace dtrain

// Clock: where the coordinator's core (group table, collective engine, key-value store) and the
// trainer's loops and callbacks read the time. Production uses absl::Now; unit tests pass a clock
// they advance by hand, and drive deadlines through each component's Tick(now), so no test of
// the core or of the loops sleeps.
#pragma once

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dtrain {

using Clock = std::function<absl::Time()>;

}  // namespace dtrain

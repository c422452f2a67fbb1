// Making directories with an error a user can act on; shared by the coordinator (job
// directories) and the worker (checkpoint directories).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dtrain {

// mkdir -p; FAILED_PRECONDITION "cannot create <what> '<path>': <the system's reason>" when it
// cannot be made.
absl::Status MakeDirectories(const std::string& path, const std::string& what = "directory");

}  // namespace dtrain

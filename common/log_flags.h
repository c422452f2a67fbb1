// --log_level and --log_format, shared by the coordinator, the worker and the CLI.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dtrain {

// Configures the log (common/log.h) for `program` from the flags, and routes gRPC's and
// protobuf's own messages through it (common/library_logs.h); INVALID_ARGUMENT names a flag
// whose value is not one of its choices.
absl::Status ConfigureLoggingFromFlags(const std::string& program);

}  // namespace dtrain

// The port a server bound (port 0 picked a free one), written for whoever started it: tests,
// deploy/local/cluster.sh, supervisors. Written whole (a temporary file, then a rename), so a
// reader polling for the file never sees a partial number.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dtrain {

// Writes `port` and a newline to `file`; nothing for an empty `file`. An error names the file.
absl::Status WritePortFile(const std::string& file, int port);

}  // namespace dtrain

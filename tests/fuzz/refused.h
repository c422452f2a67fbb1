// The fuzz targets' rule for a status their code under test answers: any refusal of the input is
// fine, but INTERNAL or UNKNOWN means that code broke rather than refused, and ends the run as a
// finding (libFuzzer saves the input).
#pragma once

#include <cstdlib>

#include "absl/status/status.h"

namespace dtrain::fuzz {

// True when `status` refuses the input; false when it is OK.
inline bool Refused(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  if (code == absl::StatusCode::kInternal || code == absl::StatusCode::kUnknown) std::abort();
  return !status.ok();
}

}  // namespace dtrain::fuzz

// The one place where absl::Status and grpc::Status meet. Both use the same canonical codes,
// so the conversion keeps code and message and loses nothing.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dtrain {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The codes a lost peer causes, as opposed to a job's own errors (which would recur anywhere):
// ABORTED (its group failed), DEADLINE_EXCEEDED (a rank hung or never came), UNAVAILABLE (a
// process or host could not be reached).
bool IsLostPeerError(const absl::Status& status);

}  // namespace dtrain

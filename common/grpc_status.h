// The one place where absl::Status and grpc::Status meet. Both use the same canonical codes,
// so the conversion keeps code and message and loses nothing.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dtrain {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace dtrain

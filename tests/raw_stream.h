// A call of any gRPC method with request bytes given as they are, whatever the method's kind:
// what a client built from other .proto files, or sending damaged bytes, puts on the wire. The
// tests use it to check what the servers answer to bytes their own stubs could not send.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/support/status.h>

#include "absl/time/time.h"

namespace dtrain::testing {

struct RawStreamResult {
  grpc::Status status;
  std::vector<std::string> answers;  // each message the server sent, in order
};

// Opens `method` (e.g. "/dtrain.v1.Jobs/GetJob") on `channel`, writes `requests` one by one (it
// stops early once the server has ended the call), half-closes, reads every answer, and returns
// them with the call's status; the whole call within `timeout`.
RawStreamResult RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::vector<std::string>& requests,
                          absl::Duration timeout = absl::Seconds(10));

}  // namespace dtrain::testing

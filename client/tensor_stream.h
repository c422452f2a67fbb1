// One tensor-collective call from the client: sends the header and the payload (referenced,
// never copied) and receives the result (copied once, from gRPC's slices into the result).
// Speaks the messages of coordinator.proto through gRPC's generic callback stub.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dtrain/v1/coordinator.pb.h"
#include "google/protobuf/message_lite.h"

namespace dtrain {

struct TensorStreamResult {
  std::vector<v1::TensorMeta> parts;
  std::string bytes;  // the parts' payloads, concatenated in order
};

// Blocks until the call ends; the transport deadline bounds the wait. `payload` may be null.
// `method` is the full gRPC method name, e.g. "/dtrain.v1.Coordinator/AllReduce".
// With `into` set, the result bytes are written straight into *into, which must already have
// exactly the result's size (the result's `bytes` is then left empty).
absl::StatusOr<TensorStreamResult> RunTensorStream(grpc::GenericStub* stub,
                                                   const std::string& method,
                                                   const google::protobuf::MessageLite& header,
                                                   const std::string* payload,
                                                   absl::Time deadline,
                                                   std::string* into = nullptr);

}  // namespace dtrain

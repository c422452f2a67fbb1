// One tensor-collective call from the client: sends the header and the payload (referenced,
// never copied) and receives the result (copied once, from gRPC's slices into the result).
// Speaks the messages of coordinator.proto through gRPC's generic callback stub.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/call_canceller.h"
#include "dtrain/v1/coordinator.pb.h"
#include "google/protobuf/message_lite.h"

namespace dtrain {

struct TensorStreamResult {
  std::vector<v1::TensorMeta> parts;
  std::string bytes;  // the parts' payloads, concatenated in order
};

// One call of RunTensorStreams: its method, header, the bytes to send (may be empty) and,
// optionally, where the result's bytes must go (exactly `into_size` of them).
struct TensorStreamSpec {
  std::string method;
  const google::protobuf::MessageLite* header = nullptr;
  const char* payload = nullptr;
  size_t payload_size = 0;
  char* into = nullptr;
  size_t into_size = 0;
};

// Runs the calls concurrently on `stub` and waits for all of them; results in spec order.
// `cancel` (may be null) cancels the calls in flight, which then fail with
// CallCanceller::Interruption of its reason.
std::vector<absl::StatusOr<TensorStreamResult>> RunTensorStreams(
    grpc::GenericStub* stub, const std::vector<TensorStreamSpec>& specs, absl::Time deadline,
    CallCanceller* cancel = nullptr);

// Blocks until the call ends; the transport deadline bounds the wait. `payload` may be null.
// `method` is the full gRPC method name, e.g. "/dtrain.v1.Coordinator/AllReduce".
// With `into` set, the result bytes are written straight into *into, which must already have
// exactly the result's size (the result's `bytes` is then left empty).
absl::StatusOr<TensorStreamResult> RunTensorStream(grpc::GenericStub* stub,
                                                   const std::string& method,
                                                   const google::protobuf::MessageLite& header,
                                                   const std::string* payload, absl::Time deadline,
                                                   std::string* into = nullptr,
                                                   CallCanceller* cancel = nullptr);

}  // namespace dtrain

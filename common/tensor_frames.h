// Zero-copy framing of the tensor-collective streams, used by both ends. The messages on the
// wire are exactly those of coordinator.proto ({header = 1, chunk = 2}); this file reads and
// writes them from gRPC's raw byte buffers so that a payload is copied once on the way in (from
// gRPC's slices into its destination) and never on the way out (outgoing slices point into the
// sender's buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

namespace dtrain {

// Where ReadFrame puts what it finds.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // Called once the header field has been parsed into the message given to ReadFrame.
  virtual absl::Status OnHeader() = 0;
  // Returns room for `bytes` more payload bytes, or an error that ends the stream.
  virtual absl::StatusOr<char*> Reserve(int64_t bytes) = 0;
};

// How much of the payload a stream's header announced has arrived: the bound both ends put on a
// peer's chunks before a byte of them is written. Each end's FrameSink::Reserve asks it.
class PayloadCursor {
 public:
  // The payload's size, from a validated header.
  void Expect(uint64_t bytes) { expected_ = bytes; }
  // The offset from the payload's start where `bytes` more go; INVALID_ARGUMENT when they are
  // negative or would pass what the header announced (nothing is taken then).
  absl::StatusOr<uint64_t> Advance(int64_t bytes);
  uint64_t expected() const { return expected_; }
  uint64_t received() const { return received_; }

 private:
  uint64_t expected_ = 0;
  uint64_t received_ = 0;
};

// Parses one stream message (request or response). `header_seen` says whether an earlier message
// carried the header; a header in a later message, or payload before any header, is
// INVALID_ARGUMENT. Unknown fields are skipped, as protobuf would.
absl::Status ReadFrame(grpc::ByteBuffer* frame, bool header_seen,
                       google::protobuf::MessageLite* header, FrameSink* sink);

// Bytes to send. With `keep_alive` set, the frame holds it until gRPC has sent the bytes;
// without, the caller guarantees the bytes outlive the call (a blocking call's own input).
struct PayloadRange {
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keep_alive;
};

// Builds one stream message: `header` (if not null) and the concatenated ranges as the chunk
// field, without copying the ranges' bytes.
grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite* header,
                           const std::vector<PayloadRange>& payload);

}  // namespace dtrain

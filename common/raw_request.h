// A request served raw (as grpc::ByteBuffer), refused as INVALID_ARGUMENT naming the method and
// the message when its bytes do not parse; one that holds a few short fields is also bounded
// before it is parsed. gRPC's typed callback methods cannot say that: a unary method answers such
// bytes UNIMPLEMENTED with no message (common/unparsable_request.h rewrites that), and a stream
// the client writes just sees its reads end.
#pragma once

#include <cstddef>
#include <string>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Register, Session and reflection requests hold a few names (each at most a few hundred
// bytes): anything larger is no such request.
inline constexpr size_t kMostSmallRequestBytes = 64 << 10;

// A message of a stream served raw (its size already bounded by the server's receive limit),
// parsed into `out`, which keeps its fields' buffers from one message of a stream to the next.
template <typename Message>
absl::Status ParseRequestInto(const grpc::ByteBuffer& buffer, absl::string_view method,
                              Message* out) {
  // Read through the buffer's slices in place, as gRPC's own deserializer does; the copy of the
  // ByteBuffer only takes references to them.
  grpc::ByteBuffer copy(buffer);
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !out->ParseFromZeroCopyStream(&reader)) {
    const std::string& file = Message::descriptor()->file()->name();
    return absl::InvalidArgumentError(absl::StrCat(
        "the request to ", method, " does not parse as ", Message::descriptor()->full_name(),
        ": a client built from other .proto files than this server's (proto/",
        absl::StartsWith(file, "dtrain/v1/") ? "dtrain/v1" : file, "), or damaged bytes"));
  }
  return absl::OkStatus();
}

template <typename Message>
absl::StatusOr<Message> ParseSmallRequest(const grpc::ByteBuffer& buffer,
                                          absl::string_view method) {
  if (buffer.Length() > kMostSmallRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request to ", method, " is a ", Message::descriptor()->full_name(),
                     " of ", buffer.Length(), " bytes; one is at most ", kMostSmallRequestBytes));
  }
  Message request;
  if (absl::Status parsed = ParseRequestInto(buffer, method, &request); !parsed.ok()) return parsed;
  return request;
}

}  // namespace dtrain

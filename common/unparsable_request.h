// A request whose bytes do not parse as its method's message is answered INVALID_ARGUMENT,
// naming the method and the message. gRPC's callback API (grpcpp 1.51,
// server_callback_handlers.h) answers such a request UNIMPLEMENTED with an empty message: a
// client generated from other .proto files, or sending damaged bytes, would read that as a
// method this server lacks. Found by tests/go_client's hostile sweep.
#pragma once

#include <grpcpp/server_builder.h>

namespace dtrain {

// Installs the server interceptor that rewrites that answer, on unary and server-streaming
// methods. Call once per builder, before BuildAndStart: it replaces any interceptor creators set
// on the builder before.
void AnswerUnparsableRequests(grpc::ServerBuilder& builder);

}  // namespace dtrain

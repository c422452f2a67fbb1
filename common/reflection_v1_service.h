// Server reflection's version 1 (grpc.reflection.v1) on every dtrain server, beside the
// grpc.reflection.v1alpha that Debian's gRPC 1.51 serves. grpcurl, buf curl and grpcui ask for v1
// first; a tool that knows only v1 would otherwise find no services. The answers are read from
// the same place as v1alpha's, the binary's generated descriptor pool, and a request that
// cannot be answered gets an error_response with the stream left open, as the protocol says.
#pragma once

namespace dtrain {

// Serves grpc.reflection.v1.ServerReflection on every ServerBuilder built after the call, as
// gRPC's own plugin does for v1alpha (process-wide; called by EnableStandardServices). Does
// nothing where the linked gRPC already serves v1 itself.
void EnableReflectionV1();

}  // namespace dtrain

// The answer to one server reflection v1 request (grpc.reflection.v1), read from this binary's
// generated descriptor pool: the file asked for or holding a symbol or extension, with every file
// it imports; a type's extension numbers; the server's services. What is not there is an
// error_response naming it (NOT_FOUND; INVALID_ARGUMENT for a request that asks nothing;
// UNIMPLEMENTED for a kind of request newer than this protocol's file).
// common/reflection_v1_service.h serves it.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.pb.h"

namespace dtrain {

// `services`: the server's service names, in the order list_services gives them; null while the
// server is still being built (list_services is then UNAVAILABLE, not an empty list).
grpc::reflection::v1::ServerReflectionResponse AnswerReflectionV1(
    const grpc::reflection::v1::ServerReflectionRequest& request,
    const std::vector<std::string>* services);

}  // namespace dtrain

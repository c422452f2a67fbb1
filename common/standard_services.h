// The standard services every dtrain server offers beside its own: the gRPC health checking
// protocol (grpc.health.v1, gRPC's built-in implementation) and server reflection (gRPC's
// v1alpha, and v1 from common/reflection_v1_service.h), so that generic tools (grpcurl,
// grpc_cli, Kubernetes' gRPC probes) can check a server and list its API without dtrain's
// .proto files.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/server.h>

namespace dtrain {

// Turns both on for every ServerBuilder built after the call (they are process-wide in gRPC).
void EnableStandardServices();

// Reports the server as a whole ("") and each of `services` (full names, e.g.
// "dtrain.v1.Coordinator") SERVING, or NOT_SERVING while it drains.
void SetServing(grpc::Server* server, const std::vector<std::string>& services, bool serving);

}  // namespace dtrain

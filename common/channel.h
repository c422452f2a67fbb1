// Creates gRPC channels to a coordinator with the settings dtrain's streams need.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>

namespace dtrain {

// A channel to `address` (host:port) with dtrain's message limits and keepalive, so a dead
// coordinator is noticed even by a call that is only waiting; TLS when the process's client
// TLS is configured (common/tls_credentials.h), plaintext otherwise; every call carries the
// process's bearer token (common/bearer_token.h). Also used for workers.
std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address);

// The same with `token` as the bearer token (empty: none), e.g. a job's own.
std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address,
                                                    const std::string& token);

}  // namespace dtrain

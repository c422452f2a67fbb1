// Creates gRPC channels to a coordinator with the settings dtrain's streams need.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>

namespace dtrain {

// An insecure channel to `address` (host:port) with dtrain's message limits and keepalive,
// so a dead coordinator is noticed even by a call that is only waiting.
std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address);

}  // namespace dtrain

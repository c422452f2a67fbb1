// Creates gRPC channels to a coordinator with the settings dtrain's streams need.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>

namespace dtrain {

// A channel to `address` (host:port) with dtrain's message limits and keepalive, so a dead
// coordinator is noticed even by a call that is only waiting; TLS when the process's client
// TLS is configured (common/tls_credentials.h), plaintext otherwise; every call carries the
// process's bearer token (common/bearer_token.h). Also used for workers.
std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address);

// The same with `token` as the bearer token (empty: none), e.g. a job's own.
std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address,
                                                    const std::string& token);

// The server side of that keepalive: dtrain's clients ping every 10 s, also on connections
// with no call in flight (a worker's channel for files is idle between checkpoints). gRPC's
// server default treats pings more often than every 5 minutes without data as abuse and closes
// the connection with GOAWAY "too_many_pings", failing whatever call is on it; every dtrain
// server accepts its own clients' pings instead.
void AcceptClientKeepalive(grpc::ServerBuilder& builder);

// gRPC binds its listening sockets with SO_REUSEPORT on Linux, so a second server started on a
// port already served (a second coordinator on the same --listen, say) starts without an error
// and the kernel then splits new connections between the two: workers register with one
// coordinator or the other, silently. Every dtrain server binds its port alone instead, so the
// second start fails saying the address is in use.
void ListenExclusively(grpc::ServerBuilder& builder);

}  // namespace dtrain

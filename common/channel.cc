#include "common/channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "common/bearer_token.h"
#include "common/streaming.h"
#include "common/tls_credentials.h"

namespace dtrain {
namespace {

constexpr int kKeepaliveTimeMs = 10000;

}  // namespace

void AcceptClientKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Half the clients' interval: a ping that arrives a little early is no strike.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveTimeMs / 2);
}

void ListenExclusively(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address) {
  return ConnectToCoordinator(address, ClientToken());
}

std::shared_ptr<grpc::Channel> ConnectToCoordinator(const std::string& address,
                                                    const std::string& token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC stops a client's pings after two that no data or headers of its own followed; a watch
  // (WatchJob) sends nothing after its request, so a coordinator that froze or vanished later
  // would never be noticed. The coordinator and the workers accept a ping every 5 s
  // (AcceptClientKeepalive), so these pings are never strikes.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Each ProcessGroup gets its own connection, as separate processes would.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // dtrain never retries a collective transparently (a retried call would be a second
  // arrival); without the retry machinery every call is also cheaper.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, ClientCredentials(), args,
                                                                 BearerTokenInterceptors(token));
}

}  // namespace dtrain

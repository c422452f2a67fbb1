// Bearer tokens on dtrain's RPCs: the "authorization: Bearer <token>" metadata every channel
// sends and every service checks.
//
// Client side, a process has one default token (SetClientToken, else DTRAIN_TOKEN), sent on
// every channel it opens unless a channel is given its own (a worker joins a job's group with
// that job's token). Server side, PresentedToken reads what a call carries and SameToken
// compares in constant time. Tokens are secrets: nothing here logs them, and callers must not
// either.
//
// Thread-safety: all functions are safe to call concurrently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/server_context.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

inline constexpr char kTokenEnvironment[] = "DTRAIN_TOKEN";
// What a worker's rank child (--child) requires of its daemon on every call: a secret the
// daemon makes for one job and hands over in the child's environment.
inline constexpr char kChildSecretEnvironment[] = "DTRAIN_CHILD_SECRET";

// Sets the process's default client token (empty: none) and exports it as DTRAIN_TOKEN, so that
// programs this one starts authenticate the same way (a worker's rank children get their job's
// token instead, worker/runtime/spawned_job.h).
void SetClientToken(const std::string& token);

// The process's default client token: the last SetClientToken, else DTRAIN_TOKEN, else empty.
std::string ClientToken();

// Interceptors that add `token` to every call of a channel; none for an empty token. For
// grpc::experimental::CreateCustomChannelWithInterceptors.
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
BearerTokenInterceptors(const std::string& token);

// The token a call presents: nullopt without an authorization header; an empty view when the
// header is not of the form "Bearer <token>".
std::optional<absl::string_view> PresentedToken(const grpc::ServerContextBase& context);

// Constant-time comparison: how much of a guess matches does not show in the time taken.
bool SameToken(absl::string_view a, absl::string_view b);

// The token a call presents, or UNAUTHENTICATED saying it is missing or malformed.
absl::StatusOr<absl::string_view> RequireBearerToken(const grpc::ServerContextBase& context);

// OK when `context` presents `expected`, or when `expected` is empty (authentication off);
// UNAUTHENTICATED saying what is missing or wrong otherwise (never echoing a token).
absl::Status CheckBearerToken(const grpc::ServerContextBase& context, absl::string_view expected);

// Servers: listening beyond loopback needs a way to tell callers apart, a token or client
// certificates, unless `insecure`. FAILED_PRECONDITION saying how otherwise.
absl::Status RequireAuthenticationBeyondLoopback(const std::string& listen_address, bool has_token,
                                                 bool mutual_tls, bool insecure);

// 32 random bytes from the kernel, hex-encoded.
std::string NewRandomToken();

// A token is printable ASCII without spaces (it travels in an HTTP/2 header): INVALID_ARGUMENT
// naming `source` (a flag, a file, the environment) otherwise.
absl::Status ValidateToken(absl::string_view token, absl::string_view source);

}  // namespace dtrain

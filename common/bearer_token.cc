#include "common/bearer_token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tls_credentials.h"

namespace dtrain {
namespace {

constexpr char kHeader[] = "authorization";
constexpr char kScheme[] = "Bearer ";

struct TokenState {
  absl::Mutex mu;
  bool set = false;
  std::string token;
};

TokenState& State() {
  static TokenState* const state = new TokenState();  // never destroyed: used at exit
  return *state;
}

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kHeader, *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;  // owned by the factory, which outlives the channel's calls
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : header_(kScheme + token) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

void SetClientToken(const std::string& token) {
  TokenState& state = State();
  absl::MutexLock lock(&state.mu);
  state.set = true;
  state.token = token;
  if (token.empty()) {
    unsetenv(kTokenEnvironment);
  } else {
    setenv(kTokenEnvironment, token.c_str(), 1);
  }
}

std::string ClientToken() {
  TokenState& state = State();
  absl::MutexLock lock(&state.mu);
  if (state.set) return state.token;
  const char* value = std::getenv(kTokenEnvironment);
  return value == nullptr ? "" : value;
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
BearerTokenInterceptors(const std::string& token) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  if (!token.empty()) out.push_back(std::make_unique<TokenInterceptorFactory>(token));
  return out;
}

std::optional<absl::string_view> PresentedToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kHeader);
  if (it == metadata.end()) return std::nullopt;
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kScheme)) return absl::string_view();
  return value.substr(sizeof(kScheme) - 1);
}

bool SameToken(absl::string_view a, absl::string_view b) {
  // The length is not secret (every dtrain-made token has the same); the bytes are.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<absl::string_view> RequireBearerToken(const grpc::ServerContextBase& context) {
  std::optional<absl::string_view> presented = PresentedToken(context);
  if (!presented.has_value()) {
    return absl::UnauthenticatedError(
        "this service requires a bearer token: give --token, --token_file or set DTRAIN_TOKEN");
  }
  if (presented->empty()) {
    return absl::UnauthenticatedError(
        "the authorization header is not of the form 'Bearer <token>'");
  }
  return *presented;
}

absl::Status CheckBearerToken(const grpc::ServerContextBase& context, absl::string_view expected) {
  if (expected.empty()) return absl::OkStatus();
  absl::StatusOr<absl::string_view> presented = RequireBearerToken(context);
  if (!presented.ok()) return presented.status();
  if (!SameToken(*presented, expected)) {
    return absl::UnauthenticatedError(
        "the bearer token presented is not the one this service accepts");
  }
  return absl::OkStatus();
}

absl::Status RequireAuthenticationBeyondLoopback(const std::string& listen_address, bool has_token,
                                                 bool mutual_tls, bool insecure) {
  if (has_token || mutual_tls || insecure || IsLoopbackAddress(listen_address)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve ", listen_address,
      " without authentication: anyone who reaches it "
      "could run code on this cluster. Give a token (--token_file, --token or DTRAIN_TOKEN), or "
      "require client certificates (--tls_require_client_cert), or pass --insecure"));
}

std::string NewRandomToken() {
  char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    // getrandom cannot fail otherwise on Linux >= 3.17 with a valid buffer; never fall back to a
    // weaker source for a secret.
    if (n < 0) std::abort();
    filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

absl::Status ValidateToken(absl::string_view token, absl::string_view source) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(source, " is empty"));
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       " holds a character that cannot travel in a header (space, control or "
                       "non-ASCII); a token is printable ASCII, e.g. from `openssl rand -hex 32`"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain

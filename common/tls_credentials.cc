#include "common/tls_credentials.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the TLS ", what, " file '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " file '", path, "' is not PEM"));
  }
  return text.str();
}

struct ClientState {
  absl::Mutex mu;
  bool configured = false;
  bool encrypted = false;  // TLS, not plaintext
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

bool AnyTls(const TlsFiles& tls) {
  return !tls.ca.empty() || !tls.cert.empty() || !tls.key.empty();
}

ClientState& Client() {
  static ClientState* const state = new ClientState();  // never destroyed: used at exit
  return *state;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeClientCredentials(
    const TlsFiles& tls) {
  if (tls.ca.empty() && tls.cert.empty() && tls.key.empty())
    return grpc::InsecureChannelCredentials();
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs both --tls_cert and --tls_key");
  }
  grpc::SslCredentialsOptions options;
  if (!tls.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.ca, "CA");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (!tls.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(tls.cert, "certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(tls.key, "key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& listen_address, const TlsFiles& tls, bool require_client_cert,
    bool insecure) {
  if (tls.cert.empty() && tls.key.empty()) {
    if (require_client_cert) {
      return absl::InvalidArgumentError("--tls_require_client_cert needs --tls_cert and --tls_key");
    }
    if (!insecure && !IsLoopbackAddress(listen_address)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to listen on ", listen_address,
          " without TLS: give --tls_cert and --tls_key (and --tls_ca), or pass --insecure to "
          "accept plaintext from the network"));
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key");
  }
  absl::StatusOr<std::string> cert = ReadPem(tls.cert, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(
      require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!tls.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.ca, "CA");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  } else if (require_client_cert) {
    return absl::InvalidArgumentError("--tls_require_client_cert needs --tls_ca to verify clients");
  }
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::Status ConfigureClientTls(const TlsFiles& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeClientCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  ClientState& state = Client();
  absl::MutexLock lock(&state.mu);
  state.credentials = std::move(*credentials);
  state.configured = true;
  state.encrypted = AnyTls(tls);
  return absl::OkStatus();
}

TlsFiles ClientTlsFromEnvironment(const TlsFiles& flags) {
  TlsFiles tls;
  tls.ca = flags.ca.empty() ? Env("DTRAIN_TLS_CA") : flags.ca;
  tls.cert = flags.cert.empty() ? Env("DTRAIN_TLS_CERT") : flags.cert;
  tls.key = flags.key.empty() ? Env("DTRAIN_TLS_KEY") : flags.key;
  return tls;
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials() {
  ClientState& state = Client();
  absl::MutexLock lock(&state.mu);
  if (!state.configured) {
    state.encrypted = AnyTls(ClientTlsFromEnvironment());
    // Not configured explicitly: the environment's, once. A broken environment fails every
    // TLS handshake with the reason in the server's log rather than silently going plaintext.
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        MakeClientCredentials(ClientTlsFromEnvironment());
    state.credentials =
        credentials.ok() ? *credentials : grpc::SslCredentials(grpc::SslCredentialsOptions());
    state.configured = true;
  }
  return state.credentials;
}

bool ClientTlsEnabled() {
  (void)ClientCredentials();  // settles the environment's, if nothing was configured
  ClientState& state = Client();
  absl::MutexLock lock(&state.mu);
  return state.encrypted;
}

}  // namespace dtrain

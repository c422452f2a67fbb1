// Transport security for every dtrain service and every channel between them: TLS from PEM
// files (server certificate and key, the CA that signed the peers', optionally mutual TLS), with
// plaintext kept only where it cannot leak: 127.0.0.1 / localhost / [::1], or with an explicit
// --insecure.
//
// Client side, the configuration is process-wide: every channel a process opens (the CLI's,
// a worker's to its coordinator, the coordinator's to its workers, a ProcessGroup's) uses the
// same CA and client certificate. It comes from ConfigureClientTls or, by default, from the
// environment: DTRAIN_TLS_CA, DTRAIN_TLS_CERT, DTRAIN_TLS_KEY.
//
// Thread-safety: all functions are safe to call concurrently.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain {

// Paths of PEM files; empty = not given.
struct TlsFiles {
  std::string cert;  // this process's certificate chain
  std::string key;   // its private key
  std::string ca;    // the CA that signed the peers' certificates
};

// Whether `address` (host:port) can only be reached from this machine.
bool IsLoopbackAddress(const std::string& address);

// Credentials for a server listening on `listen_address`: TLS when `tls` has a certificate and
// key (with `require_client_cert`, clients must present a certificate signed by tls.ca).
// Without TLS, a non-loopback address is FAILED_PRECONDITION unless `insecure`.
// Unreadable files are INVALID_ARGUMENT naming the file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& listen_address, const TlsFiles& tls, bool require_client_cert,
    bool insecure);

// Sets the process's client TLS: `tls.ca` verifies servers, `tls.cert`/`tls.key` (optional)
// answer servers that require client certificates. All empty = plaintext.
absl::Status ConfigureClientTls(const TlsFiles& tls);

// The environment's client TLS (DTRAIN_TLS_CA, DTRAIN_TLS_CERT, DTRAIN_TLS_KEY), with `flags`
// taking precedence field by field.
TlsFiles ClientTlsFromEnvironment(const TlsFiles& flags = {});

// Credentials for a new channel: TLS if configured (or set in the environment), else plaintext.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials();

// Whether this process's channels use TLS (ClientCredentials' choice).
bool ClientTlsEnabled();

}  // namespace dtrain

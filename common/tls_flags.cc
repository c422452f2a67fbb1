#include "common/tls_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this process (TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that signed the peers' certificates; also env DTRAIN_TLS_CA");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "servers: require clients to present a certificate signed by --tls_ca (mutual TLS)");
ABSL_FLAG(bool, insecure, false,
          "servers: allow plaintext on a non-loopback --listen address (default: refused)");

namespace dtrain {

TlsFiles TlsFilesFromFlags() {
  return {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
}

bool RequireClientCertFromFlags() { return absl::GetFlag(FLAGS_tls_require_client_cert); }

bool InsecureFromFlags() { return absl::GetFlag(FLAGS_insecure); }

absl::Status ConfigureClientTlsFromFlags() {
  const TlsFiles tls = ClientTlsFromEnvironment(TlsFilesFromFlags());
  if (absl::Status s = ConfigureClientTls(tls); !s.ok()) return s;
  if (!tls.ca.empty()) setenv("DTRAIN_TLS_CA", tls.ca.c_str(), 1);
  if (!tls.cert.empty()) setenv("DTRAIN_TLS_CERT", tls.cert.c_str(), 1);
  if (!tls.key.empty()) setenv("DTRAIN_TLS_KEY", tls.key.c_str(), 1);
  return absl::OkStatus();
}

}  // namespace dtrain

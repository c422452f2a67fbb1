// The TLS command-line flags shared by dtrain-coordinator, dtrain-worker and dtrain:
// --tls_cert, --tls_key, --tls_ca (all three), --tls_require_client_cert and --insecure (the
// servers). See tls_credentials.h for what they mean.
#pragma once

#include "common/tls_credentials.h"

namespace dtrain {

TlsFiles TlsFilesFromFlags();
bool RequireClientCertFromFlags();
bool InsecureFromFlags();

// Configures this process's client TLS from the flags (falling back to the DTRAIN_TLS_*
// environment) and exports the result to the environment, so that processes this one starts
// (ddp_spawn children) connect the same way.
absl::Status ConfigureClientTlsFromFlags();

}  // namespace dtrain

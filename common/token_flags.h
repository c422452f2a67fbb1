// The bearer-token flags shared by dtrain-coordinator, dtrain-worker and dtrain: --token and
// --token_file, falling back to the DTRAIN_TOKEN environment. See bearer_token.h.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dtrain {

// The token the flags or the environment give (empty: none), in this order: --token_file's
// contents (trailing whitespace dropped), --token, DTRAIN_TOKEN. INVALID_ARGUMENT naming the
// source when the file cannot be read or the token cannot travel in a header.
absl::StatusOr<std::string> TokenFromFlags();

// TokenFromFlags, made this process's default client token (and exported to its children).
absl::StatusOr<std::string> ConfigureClientTokenFromFlags();

// For a server listening on `listen`: ConfigureClientTokenFromFlags (a daemon presents the
// token it requires), and FAILED_PRECONDITION when the address is beyond loopback with neither
// a token nor client certificates and without --insecure.
absl::StatusOr<std::string> ConfigureServerTokenFromFlags(const std::string& listen);

}  // namespace dtrain

#include "common/token_flags.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/bearer_token.h"
#include "common/tls_flags.h"

ABSL_FLAG(std::string, token, "",
          "bearer token: the cluster's admin token (coordinator: the one it accepts; workers "
          "and clients: the one they present); also env DTRAIN_TOKEN. Visible to `ps`: prefer "
          "--token_file or the environment on shared machines");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token (see --token)");

namespace dtrain {

absl::StatusOr<std::string> TokenFromFlags() {
  const std::string file = absl::GetFlag(FLAGS_token_file);
  std::string token;
  std::string source;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
      return absl::InvalidArgumentError(absl::StrCat("cannot read --token_file '", file, "'"));
    std::stringstream text;
    text << in.rdbuf();
    token = std::string(absl::StripTrailingAsciiWhitespace(text.str()));
    source = absl::StrCat("--token_file '", file, "'");
  } else if (!absl::GetFlag(FLAGS_token).empty()) {
    token = absl::GetFlag(FLAGS_token);
    source = "--token";
  } else if (const char* env = std::getenv(kTokenEnvironment); env != nullptr && *env != '\0') {
    token = env;
    source = kTokenEnvironment;
  } else {
    return std::string();
  }
  if (absl::Status s = ValidateToken(token, source); !s.ok()) return s;
  return token;
}

absl::StatusOr<std::string> ConfigureClientTokenFromFlags() {
  absl::StatusOr<std::string> token = TokenFromFlags();
  if (token.ok()) SetClientToken(*token);
  return token;
}

absl::StatusOr<std::string> ConfigureServerTokenFromFlags(const std::string& listen) {
  absl::StatusOr<std::string> token = ConfigureClientTokenFromFlags();
  if (!token.ok()) return token;
  if (absl::Status s = RequireAuthenticationBeyondLoopback(
          listen, !token->empty(), RequireClientCertFromFlags(), InsecureFromFlags());
      !s.ok()) {
    return s;
  }
  return token;
}

}  // namespace dtrain

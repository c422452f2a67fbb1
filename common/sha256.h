// SHA-256 over bytes as they stream past (OpenSSL's EVP interface, Debian's libssl-dev), and
// the "sha256:<64 lowercase hex>" digests that name content-addressed files (job artifacts).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // "sha256:<hex>" of everything updated so far; the hasher is spent afterwards.
  std::string Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The digest of a whole file, read in blocks. NOT_FOUND when it cannot be opened.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);
// The digest of what `fd` holds from its current offset to its end (for a caller that opened
// the file its own way, e.g. without following links). DATA_LOSS when a read fails.
absl::StatusOr<std::string> Sha256OfDescriptor(int fd);

// INVALID_ARGUMENT unless `digest` is "sha256:" followed by 64 lowercase hex digits, so that a
// digest is safe to use as a file name.
absl::Status CheckDigest(absl::string_view digest);

}  // namespace dtrain

#include "common/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dtrain {

struct Sha256::State {
  EVP_MD_CTX* context = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->context = EVP_MD_CTX_new();
  EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->context); }

void Sha256::Update(absl::string_view bytes) {
  EVP_DigestUpdate(state_->context, bytes.data(), bytes.size());
}

std::string Sha256::Finish() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(state_->context, digest, &size);
  std::string out = "sha256:";
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < size; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  absl::StatusOr<std::string> digest = Sha256OfDescriptor(fd);
  ::close(fd);
  if (!digest.ok()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return digest;
}

absl::StatusOr<std::string> Sha256OfDescriptor(int fd) {
  Sha256 hash;
  std::vector<char> block(1 << 20);
  ssize_t n;
  while ((n = ::read(fd, block.data(), block.size())) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat("read failed: ", std::strerror(errno)));
    hash.Update(absl::string_view(block.data(), static_cast<size_t>(n)));
  }
  return hash.Finish();
}

absl::Status CheckDigest(absl::string_view digest) {
  constexpr absl::string_view kPrefix = "sha256:";
  bool ok = absl::StartsWith(digest, kPrefix) && digest.size() == kPrefix.size() + 64;
  for (size_t i = kPrefix.size(); ok && i < digest.size(); ++i) {
    const char c = digest[i];
    ok = absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", digest.substr(0, 80),
                   "' is not a digest; expected sha256: and 64 lowercase hex digits"));
}

}  // namespace dtrain

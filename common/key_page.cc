// Page tokens are the last key, web-safe base64: opaque to clients, and a key's bytes never
// reach a proto string field that must be UTF-8.
#include "common/key_page.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace dtrain {

absl::StatusOr<KeyPage> KeyPage::Parse(int32_t page_size, absl::string_view page_token,
                                       size_t most_bytes) {
  if (page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be >= 0 (0: as many as fit), got ", page_size));
  }
  KeyPage page(page_size, most_bytes);
  if (page_token.empty()) return page;
  // Not echoed: a token is opaque, and a hostile one could be anything.
  const absl::Status refused = absl::InvalidArgumentError(
      absl::StrCat("page_token (", page_token.size(),
                   " bytes) is not one this service gave; pass next_page_token as is"));
  if (page_token.size() > kMostPageTokenBytes) return refused;
  if (!absl::WebSafeBase64Unescape(page_token, &page.after_)) return refused;
  page.resumes_ = true;
  return page;
}

bool KeyPage::Take(absl::string_view key, size_t bytes) {
  if (taken_ > 0 && ((most_ > 0 && taken_ >= most_) || bytes_ + bytes > most_bytes_)) {
    more_ = true;
    return false;
  }
  ++taken_;
  bytes_ += bytes;
  last_.assign(key.data(), key.size());
  return true;
}

std::string KeyPage::next_page_token() const {
  return more_ ? absl::WebSafeBase64Escape(last_) : std::string();
}

}  // namespace dtrain

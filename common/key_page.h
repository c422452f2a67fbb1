// One page of a listing sorted by a unique key (ListWorkers by name, ListGroups by group id,
// KeyValueList by key), as ListJobs pages: a page_size (0: as many as fit one answer) and an
// opaque page_token that resumes after the last key the page before held. Resuming after a key,
// not at an index, keeps a listing that changes between pages from repeating or skipping an
// entry that was there throughout.
//
// Thread-safety: a KeyPage is a value; use one per listing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The longest page_token taken: a key of the longest kind (a key-value key, 4 KiB) encoded.
inline constexpr size_t kMostPageTokenBytes = 8 << 10;

class KeyPage {
 public:
  // INVALID_ARGUMENT for a negative page_size or a token this service did not give, naming
  // the field. `most_bytes` bounds the entries' encoded sizes together; the first always fits.
  static absl::StatusOr<KeyPage> Parse(int32_t page_size, absl::string_view page_token,
                                       size_t most_bytes);

  // Whether the listing starts after a key (a token was given), and which.
  bool resumes() const { return resumes_; }
  const std::string& after() const { return after_; }

  // Counts an entry of `bytes` under `key` (keys come in order) if the page has room for it;
  // false once it has not, and the listing stops there.
  bool Take(absl::string_view key, size_t bytes);
  // "" unless an entry was refused: then the token of the page after this one.
  std::string next_page_token() const;

 private:
  KeyPage(int32_t most, size_t most_bytes) : most_(most), most_bytes_(most_bytes) {}

  const int32_t most_;  // 0: bound by bytes alone
  const size_t most_bytes_;
  bool resumes_ = false;
  std::string after_;
  int32_t taken_ = 0;
  size_t bytes_ = 0;
  std::string last_;
  bool more_ = false;
};

}  // namespace dtrain

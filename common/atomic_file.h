// Files written whole or not at all, without following a link someone else planted: the bytes
// go to a new file created exclusively in the same directory (mkstemp: a random name, O_EXCL,
// so neither a link nor a file already there is ever opened), then it is renamed over the
// destination, which replaces a link there rather than writing through it.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Writes `bytes` to `path` atomically with permissions `mode`. FAILED_PRECONDITION naming the
// file and the reason when it cannot; nothing is left behind then.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 mode_t mode = 0600);

// The same, and the written file stays open for appends: its descriptor, positioned at its end,
// which the caller closes.
absl::StatusOr<int> WriteFileAtomicallyKeepOpen(const std::string& path, absl::string_view bytes,
                                                mode_t mode = 0600);

// A new, empty file beside `path` (named `path` + ".part-" and six random characters, created
// exclusively, then given `mode`), opened for writing: for a caller that streams into it and
// then renames it over `path`, or removes it. Its stream and name; FAILED_PRECONDITION naming
// the directory and the reason when it cannot be made.
struct FileBeside {
  std::FILE* file = nullptr;
  std::string path;
};
absl::StatusOr<FileBeside> CreateFileBeside(const std::string& path, mode_t mode = 0600);

}  // namespace dtrain

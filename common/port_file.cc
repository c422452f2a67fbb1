#include "common/port_file.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"

namespace dtrain {

absl::Status WritePortFile(const std::string& file, int port) {
  if (file.empty()) return absl::OkStatus();
  // Readable by others: launch scripts of another user (an operator's) may wait on it.
  absl::Status written = WriteFileAtomically(file, absl::StrCat(port, "\n"), 0644);
  if (!written.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write the port file: ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

#include "common/directories.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::Status MakeDirectories(const std::string& path, const std::string& what) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", what, " '", path, "': ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

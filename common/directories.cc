#include "common/directories.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

absl::Status MakePrivateDirectory(const std::string& path, const std::string& what) {
  if (absl::Status s = MakeDirectories(path, what); !s.ok()) return s;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot inspect ", what, " '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(what, " '", path, "' is not a directory"));
  }
  // root's directories (a volume's mount point, /var/lib) are the operator's; any other user's
  // is not, nor one that every user may write.
  const bool mine = st.st_uid == ::geteuid();
  if (!mine && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " '", path, "' belongs to user ", st.st_uid, ", not to user ", ::geteuid(),
        " that runs this process: files another user planted there would be trusted; remove it "
        "or choose another directory"));
  }
  if (!mine && (st.st_mode & S_IWOTH) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path,
                     "' may be written by every user: files planted there would be "
                     "trusted; choose a directory of this process's user"));
  }
  if (mine && (st.st_mode & 077) != 0 && ::chmod(path.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", what, " '", path, "' private (0700): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

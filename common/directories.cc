#include "common/directories.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// An absolute directory from the environment variable `name` (the first of a ':' list), or "".
// A relative one is ignored, as the XDG base directory specification says.
std::string DirectoryFromEnvironment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return "";
  std::string dir(value);
  dir = dir.substr(0, dir.find(':'));
  return !dir.empty() && dir[0] == '/' ? dir : "";
}

std::string DefaultDirectory(const char* systemd, const char* root, const char* xdg,
                             const char* home_relative) {
  if (std::string dir = DirectoryFromEnvironment(systemd); !dir.empty()) return dir;
  if (::geteuid() == 0) return root;
  if (std::string dir = DirectoryFromEnvironment(xdg); !dir.empty()) return dir + "/dtrain";
  std::string home = DirectoryFromEnvironment("HOME");
  if (home.empty()) {
    // A service started without HOME: the user's home from the password database.
    struct passwd entry;
    struct passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (::getpwuid_r(::geteuid(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
        found != nullptr && found->pw_dir != nullptr && found->pw_dir[0] == '/') {
      home = found->pw_dir;
    }
  }
  if (!home.empty() && home != "/") return absl::StrCat(home, "/", home_relative, "/dtrain");
  // No home at all: a directory named after the user. MakePrivateDirectory checks only the
  // directory it makes, so on such a machine name private directories with the flags.
  return absl::StrCat("/tmp/dtrain-", ::geteuid());
}

}  // namespace

std::string DefaultStateDirectory() {
  return DefaultDirectory("STATE_DIRECTORY", "/var/lib/dtrain", "XDG_STATE_HOME", ".local/state");
}

std::string DefaultCacheDirectory() {
  return DefaultDirectory("CACHE_DIRECTORY", "/var/cache/dtrain", "XDG_CACHE_HOME", ".cache");
}

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

#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::StatusOr<int> WriteFileAtomicallyKeepOpen(const std::string& path, absl::string_view bytes,
                                                mode_t mode) {
  std::string temporary = path + ".tmp-XXXXXX";
  const int fd = ::mkostemp(temporary.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a file beside '", path, "': ", std::strerror(errno)));
  }
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(temporary.c_str());
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", reason));
  };
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(absl::StrCat("cannot write '", temporary, "'"));
    written += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0)
    return fail(absl::StrCat("cannot set the mode of '", temporary, "'"));
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return fail(absl::StrCat("cannot move '", temporary, "' into place at '", path, "'"));
  }
  return fd;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes, mode_t mode) {
  absl::StatusOr<int> fd = WriteFileAtomicallyKeepOpen(path, bytes, mode);
  if (!fd.ok()) return fd.status();
  ::close(*fd);
  return absl::OkStatus();
}

absl::StatusOr<FileBeside> CreateFileBeside(const std::string& path, mode_t mode) {
  FileBeside out;
  out.path = path + ".part-XXXXXX";
  const int fd = ::mkostemp(out.path.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a file beside '", path, "': ", std::strerror(errno)));
  }
  if (mode != 0600 && ::fchmod(fd, mode) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(out.path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set the mode of '", out.path, "': ", reason));
  }
  out.file = ::fdopen(fd, "wb");
  if (out.file == nullptr) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(out.path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open '", out.path, "' for writing: ", reason));
  }
  return out;
}

}  // namespace dtrain

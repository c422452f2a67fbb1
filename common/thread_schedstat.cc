#include "common/thread_schedstat.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dtrain {

absl::StatusOr<ThreadSchedstat> ParseSchedstat(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  // This abseil's string_view is its own type, not std::string_view.
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ' ');
  if (fields.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedstat: expected 3 counts separated by spaces, got ", fields.size(), " field(s)"));
  }
  int64_t counts[3];
  for (int i = 0; i < 3; ++i) {
    // SimpleAtoi takes a sign and surrounding blanks; the kernel writes neither.
    const bool digits =
        !fields[i].empty() && fields[i].find_first_not_of("0123456789") == absl::string_view::npos;
    if (!digits || !absl::SimpleAtoi(fields[i], &counts[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedstat: field ", i + 1, " is not a count that fits 64 bits"));
    }
  }
  return ThreadSchedstat{counts[0], counts[1], counts[2]};
}

absl::StatusOr<ThreadSchedstat> ThisThreadSchedstat() {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("no /proc/thread-self/schedstat: ", std::strerror(errno)));
  }
  // Three 64-bit counts fit in 3 x 20 digits, 2 spaces and a newline: a longer file is not the
  // format, and the read stops at the buffer either way.
  char buffer[96];
  ssize_t n;
  do {
    n = ::read(fd, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) {
    return absl::UnavailableError(
        absl::StrCat("reading /proc/thread-self/schedstat: ", std::strerror(read_errno)));
  }
  absl::StatusOr<ThreadSchedstat> parsed =
      ParseSchedstat(std::string_view(buffer, static_cast<size_t>(n)));
  // A running thread has run at least once; a kernel with the statistics turned off writes zeros.
  if (parsed.ok() && parsed->slices == 0) {
    return absl::UnavailableError("the kernel keeps no scheduler statistics (schedstat is 0 0 0)");
  }
  return parsed;
}

}  // namespace dtrain

#include "common/port_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::Status WritePortFile(const std::string& file, int port) {
  if (file.empty()) return absl::OkStatus();
  const std::string tmp = file + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out.flush()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write the port file '", tmp, "': ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rename '", tmp, "' to '", file, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

#include "worker/data/idx_file.h"

#include <zlib.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::StatusOr<IdxArray> ReadIdxGz(const std::string& path) {
  if (!std::ifstream(path).good()) {
    return absl::NotFoundError(absl::StrCat("dataset file '", path, "' does not exist"));
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open '", path, "' with zlib"));
  }
  std::string bytes;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) bytes.append(buffer, n);
  int error = Z_OK;
  const char* message = gzerror(file, &error);
  const std::string zlib_message = message == nullptr ? "" : message;
  gzclose(file);
  if (n < 0 || (error != Z_OK && error != Z_STREAM_END)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a valid gzip file: ", zlib_message));
  }
  auto u8 = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  if (bytes.size() < 4 || u8(0) != 0 || u8(1) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not an IDX file"));
  }
  if (u8(2) != 0x08) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' holds IDX type 0x", absl::Hex(u8(2)), "; only unsigned bytes are read"));
  }
  const int dims = u8(3);
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (dims == 0 || bytes.size() < header) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' has a truncated IDX header"));
  }
  IdxArray array;
  int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    const size_t at = 4 + 4 * static_cast<size_t>(d);
    const int64_t size = (int64_t{u8(at)} << 24) | (int64_t{u8(at + 1)} << 16) |
                         (int64_t{u8(at + 2)} << 8) | int64_t{u8(at + 3)};
    array.shape.push_back(size);
    count *= size;
  }
  if (static_cast<int64_t>(bytes.size() - header) != count) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' should hold ", count,
                                                   " values after its header, has ",
                                                   bytes.size() - header));
  }
  array.data = bytes.substr(header);
  return array;
}

}  // namespace dtrain

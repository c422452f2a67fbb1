#include "worker/data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// Reads up to `n` bytes into `out`; fewer only at the end of the input. -1: an error.
int64_t ReadSome(const IdxRead& read, char* out, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const int64_t got = read(out + done, n - done);
    if (got < 0) return -1;
    if (got == 0) break;
    done += got;
  }
  return done;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const IdxRead& read, const std::string& name, int64_t max_values) {
  // The header first: nothing is allocated for the values until their count is known, checked
  // for overflow and bounded, and no more than that count is read (a small gzip file can
  // inflate to gigabytes).
  unsigned char magic[4];
  int64_t got = ReadSome(read, reinterpret_cast<char*>(magic), 4);
  if (got < 0) return absl::InvalidArgumentError(absl::StrCat("cannot read '", name, "'"));
  if (got < 4 || magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not an IDX file"));
  }
  if (magic[2] != 0x08) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name, "' holds IDX type 0x", absl::Hex(magic[2]), "; only unsigned bytes are read"));
  }
  const int dims = magic[3];
  if (dims == 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' has a truncated IDX header"));
  }
  IdxArray array;
  int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    unsigned char b[4];
    if (ReadSome(read, reinterpret_cast<char*>(b), 4) != 4) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' has a truncated IDX header"));
    }
    const int64_t size =
        (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    array.shape.push_back(size);
    if (size != 0 && count > max_values / size) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", name, "' declares dimensions whose product is over ", max_values,
                       " values (", d + 1, " of ", dims, " read), more than dtrain reads"));
    }
    count *= size;
  }
  array.data.resize(static_cast<size_t>(count));
  got = ReadSome(read, array.data.data(), count);
  if (got < 0) return absl::InvalidArgumentError(absl::StrCat("cannot read '", name, "'"));
  char extra = 0;
  const int64_t more = got == count ? ReadSome(read, &extra, 1) : 0;
  if (got != count || more != 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' should hold ", count,
                                                   " values after its header, has ",
                                                   got == count ? "more" : absl::StrCat(got)));
  }
  return array;
}

absl::StatusOr<IdxArray> ReadIdxGz(const std::string& path) {
  if (!std::ifstream(path).good()) {
    return absl::NotFoundError(absl::StrCat("dataset file '", path, "' does not exist"));
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open '", path, "' with zlib"));
  }
  std::string zlib_message;
  auto read = [&](char* out, int64_t n) -> int64_t {
    const int chunk = static_cast<int>(std::min<int64_t>(n, 1 << 20));
    const int got = gzread(file, out, static_cast<unsigned>(chunk));
    if (got < 0) {
      int error = Z_OK;
      const char* message = gzerror(file, &error);
      zlib_message = message == nullptr ? "" : message;
    }
    return got;
  };
  absl::StatusOr<IdxArray> array = ReadIdx(read, path);
  int error = Z_OK;
  const char* message = gzerror(file, &error);
  if (zlib_message.empty() && message != nullptr) zlib_message = message;
  gzclose(file);
  if (!zlib_message.empty() && error != Z_OK && error != Z_STREAM_END) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a valid gzip file: ", zlib_message));
  }
  return array;
}

}  // namespace dtrain

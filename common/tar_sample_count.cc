#include "common/tar_sample_count.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dtrain {

std::optional<std::pair<std::string, std::string>> SplitMemberName(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', base);
  if (dot == std::string::npos || dot == base || dot + 1 == path.size()) return std::nullopt;
  return std::make_pair(path.substr(0, dot), absl::AsciiStrToLower(path.substr(dot + 1)));
}

absl::StatusOr<int64_t> CountTarSamples(const std::string& path) {
  struct archive* a = archive_read_new();
  if (a == nullptr) return absl::ResourceExhaustedError("libarchive: out of memory");
  archive_read_support_format_tar(a);
  archive_read_support_filter_gzip(a);
  archive_read_support_filter_none(a);
  struct Closer {
    struct archive* a;
    ~Closer() { archive_read_free(a); }
  } closer{a};
  if (archive_read_open_filename(a, path.c_str(), 64 << 10) != ARCHIVE_OK) {
    const std::string message = absl::StrCat("shard '", path, "': ", archive_error_string(a));
    if (archive_errno(a) == ENOENT) return absl::NotFoundError(message);
    return absl::DataLossError(message);
  }
  int64_t samples = 0;
  std::optional<std::string> last;
  while (true) {
    struct archive_entry* entry = nullptr;
    const int r = archive_read_next_header(a, &entry);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return absl::DataLossError(absl::StrCat("shard '", path, "' after ", samples,
                                              " samples: ", archive_error_string(a)));
    }
    if (archive_entry_filetype(entry) == AE_IFREG) {
      const char* name = archive_entry_pathname(entry);
      std::optional<std::pair<std::string, std::string>> split =
          SplitMemberName(name == nullptr ? "" : name);
      if (split.has_value() && (!last.has_value() || *last != split->first)) {
        ++samples;
        last = split->first;
      }
    }
    if (archive_read_data_skip(a) != ARCHIVE_OK) {
      return absl::DataLossError(absl::StrCat("shard '", path, "' after ", samples,
                                              " samples: ", archive_error_string(a)));
    }
  }
  return samples;
}

}  // namespace dtrain

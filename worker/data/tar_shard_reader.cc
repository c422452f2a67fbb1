#include "worker/data/tar_shard_reader.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

constexpr size_t kReadBlockBytes = 64 << 10;

// libarchive's reason for its last failure; it may have none (a null string).
std::string Reason(struct archive* a) {
  const char* reason = archive_error_string(a);
  return reason != nullptr ? reason : "libarchive gave no reason";
}

}  // namespace

TarShardReader::TarShardReader(std::string path, TarShardLimits limits, struct archive* archive)
    : path_(std::move(path)), limits_(limits), archive_(archive) {}

TarShardReader::~TarShardReader() { archive_read_free(archive_); }

absl::StatusOr<std::unique_ptr<TarShardReader>> TarShardReader::Open(const std::string& path,
                                                                     TarShardLimits limits) {
  struct archive* a = archive_read_new();
  if (a == nullptr) return absl::ResourceExhaustedError("libarchive: out of memory");
  // Tar only (ustar, pax, GNU), gzip-compressed or not: a shard is never a zip or an ISO, and
  // every format libarchive enables is more parser facing hostile input.
  archive_read_support_format_tar(a);
  archive_read_support_filter_gzip(a);
  archive_read_support_filter_none(a);
  if (archive_read_open_filename(a, path.c_str(), kReadBlockBytes) != ARCHIVE_OK) {
    const int err = archive_errno(a);
    const std::string why = Reason(a);
    archive_read_free(a);
    const std::string message = absl::StrCat("shard '", path, "': ", why);
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::DataLossError(message);
  }
  return std::unique_ptr<TarShardReader>(new TarShardReader(path, limits, a));
}

absl::StatusOr<bool> TarShardReader::ReadMember() {
  while (true) {
    struct archive_entry* entry = nullptr;
    const int r = archive_read_next_header(archive_, &entry);
    if (r == ARCHIVE_EOF) return false;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return absl::DataLossError(absl::StrCat("shard '", path_, "' after ", samples_read_,
                                              " samples: ", Reason(archive_)));
    }
    const char* raw_name = archive_entry_pathname(entry);
    const std::string name = raw_name != nullptr ? raw_name : "";
    const mode_t type = archive_entry_filetype(entry);
    if (type == AE_IFDIR) continue;
    if (type != AE_IFREG) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", path_, "': member '", name,
                                                     "' is not a regular file (links and devices "
                                                     "are not data)"));
    }
    std::optional<std::pair<std::string, std::string>> split = SplitMemberName(name);
    if (!split.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard '", path_, "': member '", name,
                       "' has no extension to name its field (WebDataset: <key>.<field>)"));
    }
    const int64_t size = archive_entry_size_is_set(entry) ? archive_entry_size(entry) : -1;
    if (size < 0 || size > limits_.max_member_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", path_, "': member '", name, "' is ",
                                                     size, " bytes; at most ",
                                                     limits_.max_member_bytes));
    }
    // Appended block by block from libarchive's buffer rather than resized (zero-filled) and
    // then read into: the bytes are written once.
    pending_bytes_.clear();
    pending_bytes_.reserve(static_cast<size_t>(size));
    while (static_cast<int64_t>(pending_bytes_.size()) < size) {
      const void* block = nullptr;
      size_t length = 0;
      la_int64_t offset = 0;
      const int r = archive_read_data_block(archive_, &block, &length, &offset);
      const int64_t got = static_cast<int64_t>(pending_bytes_.size());
      // A sparse member's holes (a block, or the end, past what was read) read as zeros, as
      // archive_read_data gives them.
      const bool fits = offset >= got && offset <= size &&
                        static_cast<int64_t>(length) <= size - static_cast<int64_t>(offset);
      if ((r == ARCHIVE_OK || r == ARCHIVE_EOF) && fits && (length > 0 || offset > got)) {
        pending_bytes_.append(static_cast<size_t>(offset - got), '\0');
        if (length > 0) pending_bytes_.append(static_cast<const char*>(block), length);
        continue;
      }
      std::string why;
      if (r != ARCHIVE_OK && r != ARCHIVE_EOF) {
        why = absl::StrCat(": ", Reason(archive_));
      } else if (!fits) {
        why = absl::StrCat(": a block of ", length, " bytes at ", offset, " is outside it");
      }
      return absl::DataLossError(absl::StrCat("shard '", path_, "': member '", name,
                                              "' ends after ", got, " of ", size, " bytes", why));
    }
    pending_key_field_ = std::move(split);
    return true;
  }
}

absl::StatusOr<std::optional<ShardSample>> TarShardReader::Next() {
  if (!pending_key_field_.has_value()) {
    if (at_end_) return std::nullopt;
    absl::StatusOr<bool> read = ReadMember();
    if (!read.ok()) return read.status();
    if (!*read) {
      at_end_ = true;
      return std::nullopt;
    }
  }
  ShardSample sample;
  sample.key = pending_key_field_->first;
  int64_t bytes = 0;
  // Members with the same key are consecutive in a WebDataset shard; the first with another key
  // stays pending for the next sample.
  while (pending_key_field_.has_value() && pending_key_field_->first == sample.key) {
    const std::string field = std::move(pending_key_field_->second);
    pending_key_field_.reset();
    bytes += static_cast<int64_t>(pending_bytes_.size());
    if (bytes > limits_.max_sample_bytes ||
        static_cast<int>(sample.fields.size()) >= limits_.max_fields) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", path_, "': sample '", sample.key,
                                                     "' is over ", limits_.max_sample_bytes,
                                                     " bytes or ", limits_.max_fields, " fields"));
    }
    if (!sample.fields.emplace(field, std::move(pending_bytes_)).second) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", path_, "': sample '", sample.key,
                                                     "' has field '", field, "' twice"));
    }
    pending_bytes_.clear();
    absl::StatusOr<bool> read = ReadMember();
    if (!read.ok()) return read.status();
    if (!*read) at_end_ = true;
  }
  ++samples_read_;
  return sample;
}

}  // namespace dtrain

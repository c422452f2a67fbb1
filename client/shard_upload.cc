#include "client/shard_upload.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_reference.h"
#include "common/shard_list.h"
#include "common/status_macros.h"
#include "common/tar_sample_count.h"

namespace dtrain {
namespace {

absl::Status InField(const std::string& field, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
}

absl::StatusOr<std::vector<ShardEntry>> LocalEntries(const std::string& value,
                                                     const std::string& field) {
  std::error_code ec;
  std::vector<ShardEntry> entries;
  if (NamesTarShards(value)) {
    absl::StatusOr<std::vector<std::string>> names = ExpandShardPattern(value);
    if (!names.ok()) return InField(field, names.status());
    for (std::string& n : *names) entries.push_back({std::move(n), "", -1});
    return entries;
  }
  if (std::filesystem::is_directory(value, ec)) {
    std::vector<std::string> names;
    // The error_code forms throughout: an unreadable entry is an error to report, not an
    // exception to escape.
    for (std::filesystem::directory_iterator it(value, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_error;
      if (it->is_regular_file(type_error) && NamesTarShards(name) && name[0] != '.') {
        names.push_back(it->path().string());
      }
      if (names.size() > kMaxShards) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": directory '", value, "' holds more than ", kMaxShards, " shards"));
      }
    }
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": directory '", value, "' cannot be listed: ", ec.message()));
    }
    std::sort(names.begin(), names.end());
    if (names.empty()) {
      return absl::NotFoundError(absl::StrCat(field, ": directory '", value,
                                              "' holds no tar shards (*.tar, *.tar.gz, *.tgz)"));
    }
    for (std::string& n : names) entries.push_back({std::move(n), "", -1});
    return entries;
  }
  const uintmax_t size = std::filesystem::file_size(value, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat(
        field, ": '", value,
        "' is neither tar shards (*.tar), a directory nor a list file here; if it is on every "
        "worker, write worker:",
        value));
  }
  if (size > kMaxShardListBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": list file '", value, "' has ", size, " bytes; a shard list has at most ",
        kMaxShardListBytes, " (split the data into several datasets)"));
  }
  std::ifstream in(value, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<ShardEntry>> list = ParseShardList(text.str());
  if (!list.ok()) return InField(absl::StrCat(field, ": list file '", value, "'"), list.status());
  const std::string dir = std::filesystem::path(value).parent_path().string();
  for (ShardEntry& e : *list) {
    if (!IsHttpUrl(e.location) && !IsMarkedPath(e.location) && !absl::StartsWith(e.location, "/")) {
      e.location = (std::filesystem::path(dir) / e.location).lexically_normal().string();
    }
  }
  return std::move(*list);
}

}  // namespace

absl::StatusOr<ShardUpload> UploadShards(ArtifactsClient& client, const std::string& value,
                                         const std::string& field) {
  DTRAIN_ASSIGN_OR_RETURN(std::vector<ShardEntry> entries, LocalEntries(value, field));
  ShardUpload out;
  std::string list = absl::StrCat("# ", field, ": ", value, ", uploaded by dtrain\n");
  for (const ShardEntry& e : entries) {
    if (IsHttpUrl(e.location) || IsMarkedPath(e.location)) {
      absl::StrAppend(&list, e.location, e.digest.empty() ? "" : " ", e.digest,
                      e.samples >= 0 ? absl::StrCat(" samples:", e.samples) : "", "\n");
      ++out.shards;
      out.samples += std::max<int64_t>(e.samples, 0);
      continue;
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(e.location, ec)) {
      return absl::NotFoundError(
          absl::StrCat(field, ": shard '", e.location, "' is not a file here"));
    }
    int64_t samples = e.samples;
    if (samples < 0) {
      absl::StatusOr<int64_t> counted = CountTarSamples(e.location);
      if (!counted.ok()) return InField(field, counted.status());
      samples = *counted;
    }
    absl::StatusOr<UploadResult> sent = client.Upload(e.location);
    if (!sent.ok()) {
      return absl::Status(sent.status().code(), absl::StrCat(field, ": uploading '", e.location,
                                                             "': ", sent.status().message()));
    }
    if (!e.digest.empty() && e.digest != sent->digest) {
      return absl::DataLossError(absl::StrCat(field, ": shard '", e.location, "' has digest ",
                                              sent->digest, ", its list says ", e.digest));
    }
    absl::StrAppend(&list, ArtifactReference(sent->digest), " ", sent->digest, " samples:", samples,
                    "\n");
    ++out.shards;
    out.sent += sent->sent ? 1 : 0;
    out.bytes += sent->size;
    out.samples += samples;
  }
  // The list itself travels as an artifact, written to a file only this process made
  // (mkstemp: no name another user could plant a link at).
  std::error_code ec;
  std::string pattern =
      (std::filesystem::temp_directory_path(ec) / "dtrain-shards-XXXXXX").string();
  const int fd = mkstemp(pattern.data());
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(field, ": cannot create a temporary file for its shard list"));
  }
  const std::filesystem::path tmp = pattern;
  const bool written = ::write(fd, list.data(), list.size()) == static_cast<ssize_t>(list.size());
  ::close(fd);
  if (!written) {
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(absl::StrCat(field, ": cannot write '", tmp.string(), "'"));
  }
  absl::StatusOr<UploadResult> sent = client.Upload(tmp.string());
  std::filesystem::remove(tmp, ec);
  if (!sent.ok()) {
    return absl::Status(
        sent.status().code(),
        absl::StrCat(field, ": uploading its shard list: ", sent.status().message()));
  }
  out.reference = ArtifactReference(sent->digest);
  return out;
}

}  // namespace dtrain

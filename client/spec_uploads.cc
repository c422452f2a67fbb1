#include "client/spec_uploads.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/shard_upload.h"
#include "common/file_reference.h"
#include "common/job_settings.h"

namespace dtrain {

absl::Status UploadSpecFiles(ArtifactsClient& client, v1::JobSpec* spec,
                             std::vector<std::string>* uploaded) {
  // The files the job reads (Setting.path FILE or CHECKPOINT); a directory is never sent.
  return RewriteSpecPaths(spec, [&](SpecPath* p) -> absl::Status {
    if (p->kind == v1::Setting::DIRECTORY || IsMarkedPath(p->value)) return absl::OkStatus();
    if (p->kind == v1::Setting::SHARDS) {
      if (IsHttpUrl(p->value)) return absl::OkStatus();
      absl::StatusOr<ShardUpload> shards = UploadShards(client, p->value, p->path);
      if (!shards.ok()) return shards.status();
      if (uploaded != nullptr) {
        uploaded->push_back(absl::StrFormat(
            "%s: %d shards, %d samples (%.1f MB), %d sent, the list as %s", p->path, shards->shards,
            shards->samples, static_cast<double>(shards->bytes) / 1e6, shards->sent,
            shards->reference));
      }
      p->value = shards->reference;
      return absl::OkStatus();
    }
    std::error_code error;
    if (!std::filesystem::is_regular_file(p->value, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(p->path, ": '", p->value,
                       "' is not a file here, so it cannot be sent with the job; if it is "
                       "already on every worker, write worker:",
                       p->value));
    }
    absl::StatusOr<UploadResult> result = client.Upload(p->value);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat(p->path, ": uploading '", p->value,
                                                               "': ", result.status().message()));
    }
    if (uploaded != nullptr) {
      uploaded->push_back(absl::StrFormat(
          "%s: %s (%.1f MB) %s %s", p->path, std::filesystem::path(p->value).filename().string(),
          static_cast<double>(result->size) / 1e6,
          result->sent ? "sent as" : "already on the coordinator as", result->digest));
    }
    p->value = ArtifactReference(result->digest);
    return absl::OkStatus();
  });
}

}  // namespace dtrain

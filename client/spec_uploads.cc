#include "client/spec_uploads.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_reference.h"

namespace dtrain {

absl::Status UploadSpecFiles(ArtifactsClient& client, v1::JobSpec* spec,
                             std::vector<std::string>* uploaded) {
  std::vector<std::pair<std::string, std::string*>> fields;
  if (spec->model().has_torchscript()) {
    fields.emplace_back("model.torchscript", spec->mutable_model()->mutable_torchscript());
  }
  if (spec->data().has_tensors_file()) {
    fields.emplace_back("data.tensors_file", spec->mutable_data()->mutable_tensors_file());
  }
  if (!spec->ckpt_path().empty()) fields.emplace_back("ckpt_path", spec->mutable_ckpt_path());
  for (auto& [field, path] : fields) {
    if (IsMarkedPath(*path)) continue;
    std::error_code error;
    if (!std::filesystem::is_regular_file(*path, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", *path,
                       "' is not a file here, so it cannot be sent with the job; if it is "
                       "already on every worker, write worker:",
                       *path));
    }
    absl::StatusOr<UploadResult> result = client.Upload(*path);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat(field, ": uploading '", *path,
                                                               "': ", result.status().message()));
    }
    if (uploaded != nullptr) {
      uploaded->push_back(absl::StrFormat(
          "%s: %s (%.1f MB) %s %s", field, std::filesystem::path(*path).filename().string(),
          static_cast<double>(result->size) / 1e6,
          result->sent ? "sent as" : "already on the coordinator as", result->digest));
    }
    *path = ArtifactReference(result->digest);
  }
  return absl::OkStatus();
}

}  // namespace dtrain

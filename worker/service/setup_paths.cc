#include "worker/service/setup_paths.h"

#include "absl/strings/str_cat.h"
#include "common/file_reference.h"
#include "common/job_settings.h"
#include "common/setup_request.h"
#include "common/status_macros.h"
#include "worker/service/artifact_cache.h"

namespace dtrain {

absl::StatusOr<std::string> LocalPath(const std::string& spec_path, const std::string& field,
                                      ArtifactCache* cache) {
  if (!IsArtifactReference(spec_path)) return WithoutWorkerMark(spec_path);
  if (cache == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": '", spec_path, "' names an uploaded file and this worker has no cache for them"));
  }
  absl::StatusOr<std::string> local = cache->Get(ArtifactDigest(spec_path));
  if (!local.ok()) {
    return absl::Status(local.status().code(), absl::StrCat(field, ": ", local.status().message()));
  }
  return local;
}

absl::Status PrepareSetup(v1::SetupRequest* request, int devices, ArtifactCache* cache) {
  v1::TrainerConfig* t = request->mutable_spec()->mutable_trainer();
  if (t->devices() == 0) t->set_devices(devices);
  DTRAIN_RETURN_IF_ERROR(NormalizeSetupRequest(request));
  return RewriteSpecPaths(request->mutable_spec(), [&](SpecPath* p) -> absl::Status {
    // Shards are fetched one by one as a rank reads them (worker/data/shard_catalog.h), never
    // all at set-up.
    if (p->kind == v1::Setting::SHARDS) return absl::OkStatus();
    DTRAIN_ASSIGN_OR_RETURN(p->value, LocalPath(p->value, absl::StrCat("spec.", p->path), cache));
    return absl::OkStatus();
  });
}

}  // namespace dtrain

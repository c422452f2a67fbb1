// Files travel with the job: before a spec is submitted, the local files it names (the fields
// whose Setting option says FILE or CHECKPOINT: the model, the data file, the checkpoint to
// start from) are uploaded to the coordinator's content-addressed store and the spec names them
// by content ("artifact:sha256:<hex>"), so the workers need no filesystem in common with the
// client. A path written "worker:/path" names a file
// already on every worker and is left alone (nothing is uploaded by surprise); a path that is
// neither a local file nor marked is refused here, naming the field.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/artifacts_client.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// Rewrites `spec` in place; `uploaded` (optional) receives one line per file for the user
// ("model.torchscript: model.pt (1.2 MB) sent as sha256:..." or "... already on the
// coordinator").
absl::Status UploadSpecFiles(ArtifactsClient& client, v1::JobSpec* spec,
                             std::vector<std::string>* uploaded = nullptr);

}  // namespace dtrain

// The Setup a worker runs, with every path in its spec made local: a "worker:" path loses its
// mark, an uploaded "artifact:" file is fetched through the worker's ArtifactCache. It sits beside
// the cache, in the service, because only the daemon has one; a job (worker/runtime/) receives
// the prepared request and reads local files only. Plain C++ (no libtorch).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

class ArtifactCache;

// The file a spec path names on this worker (common/file_reference.h): a "worker:" path
// without its mark (the one place that mark comes off: every reader of a spec's path, Setup,
// DryRun and LoadCheckpoint, goes through here), an uploaded "artifact:" file through `cache`
// (null: FAILED_PRECONDITION), any other path as it is. Errors start with `field`.
absl::StatusOr<std::string> LocalPath(const std::string& spec_path, const std::string& field,
                                      ArtifactCache* cache);

// A Setup (or a DryRun's) as this worker runs it: the spec's trainer.devices 0 becomes
// `devices` (the worker's --devices); the spec is normalized by the coordinator's rules
// (NormalizeSetupRequest, common/setup_request.h); every path in it (the fields whose Setting
// option says so, checkpoint.dirpath too) is made local by LocalPath, so the ranks, ddp_spawn
// children included, read local files. Job::Setup takes what this returns.
absl::Status PrepareSetup(v1::SetupRequest* request, int devices, ArtifactCache* cache);

}  // namespace dtrain

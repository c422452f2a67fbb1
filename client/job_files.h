// The files a job keeps (JobStatus.files: checkpoints, predictions.csv), chosen the way
// `dtrain download JOB [best|last|NAME|predictions]` names them, and brought to a local
// directory through the Artifacts service, verified by digest.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/artifacts_client.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// "" or "all": every file; "best": the best checkpoint by checkpoint.monitor (the last one
// when nothing is monitored); "last": the last checkpoint written; "predictions": the
// predictions files (predictions.pt, batch_indices.pt, predictions.csv); otherwise a file name.
// NOT_FOUND naming what the job keeps.
absl::StatusOr<std::vector<v1::JobFile>> SelectJobFiles(const v1::JobStatus& job,
                                                        const std::string& which);

// Writes `file` to `dir`/<its name> (the directory is created). FAILED_PRECONDITION when the
// file is on the workers' shared dirpath rather than on the coordinator; INVALID_ARGUMENT for
// a name that is not a plain file name. A fetch whose bytes do not hash to the digest or that
// broke is tried again, ArtifactsClient::kAttempts in all; then its error (DATA_LOSS for
// corrupted bytes, nothing is kept). Returns the local path.
absl::StatusOr<std::string> DownloadJobFile(ArtifactsClient& artifacts, const v1::JobFile& file,
                                            const std::string& dir);

}  // namespace dtrain

// How a job spec names a file, read the same way by the client (what to upload), the
// coordinator (what to check) and the workers (what to fetch):
//   "artifact:sha256:<hex>"  uploaded to the coordinator's store, fetched by digest;
//   "worker:/path"           already on every worker, used where it is;
//   anything else            a path as written (the client's, until uploaded).
#pragma once

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace dtrain {

inline constexpr absl::string_view kArtifactPrefix = "artifact:";
inline constexpr absl::string_view kWorkerPathPrefix = "worker:";

inline bool IsArtifactReference(absl::string_view path) {
  return absl::StartsWith(path, kArtifactPrefix);
}
inline bool IsWorkerPath(absl::string_view path) {
  return absl::StartsWith(path, kWorkerPathPrefix);
}
// Either mark: not a path on the client.
inline bool IsMarkedPath(absl::string_view path) {
  return IsArtifactReference(path) || IsWorkerPath(path);
}
// "sha256:<hex>" of an artifact reference (not checked; see CheckDigest).
inline std::string ArtifactDigest(absl::string_view reference) {
  return std::string(reference.substr(kArtifactPrefix.size()));
}
inline std::string ArtifactReference(absl::string_view digest) {
  return std::string(kArtifactPrefix) + std::string(digest);
}
// A worker path without its mark; any other path as it is.
inline std::string WithoutWorkerMark(absl::string_view path) {
  return std::string(IsWorkerPath(path) ? path.substr(kWorkerPathPrefix.size()) : path);
}

}  // namespace dtrain

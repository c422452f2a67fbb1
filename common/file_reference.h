// How a job spec names a file, read the same way by the client (what to upload), the
// coordinator (what to check) and the workers (what to fetch):
//   "artifact:sha256:<hex>"  uploaded to the coordinator's store, fetched by digest;
//   "worker:/path"           already on every worker, used where it is;
//   "job:<id>/<name>"        a file another job kept (a checkpoint), resolved by the
//                            coordinator to its content;
//   anything else            a path as written (the client's, until uploaded).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtrain {

inline constexpr absl::string_view kArtifactPrefix = "artifact:";
inline constexpr absl::string_view kWorkerPathPrefix = "worker:";
inline constexpr absl::string_view kJobFilePrefix = "job:";

inline bool IsArtifactReference(absl::string_view path) {
  return absl::StartsWith(path, kArtifactPrefix);
}
inline bool IsWorkerPath(absl::string_view path) {
  return absl::StartsWith(path, kWorkerPathPrefix);
}
inline bool IsJobFileReference(absl::string_view path) {
  return absl::StartsWith(path, kJobFilePrefix);
}
// Any mark: not a path on the client.
inline bool IsMarkedPath(absl::string_view path) {
  return IsArtifactReference(path) || IsWorkerPath(path) || IsJobFileReference(path);
}
// "sha256:<hex>" of an artifact reference (not checked; see CheckDigest).
inline std::string ArtifactDigest(absl::string_view reference) {
  return std::string(reference.substr(kArtifactPrefix.size()));
}
inline std::string ArtifactReference(absl::string_view digest) {
  return std::string(kArtifactPrefix) + std::string(digest);
}
inline std::string JobFileReference(absl::string_view job_id, absl::string_view name) {
  return absl::StrCat(kJobFilePrefix, job_id, "/", name);
}

// A name a job's file may have, where it becomes a file name on a worker and on the
// coordinator: 1-200 of letters, digits, '.', '_', '=', '-', not starting with '.' (so no "..",
// no hidden files) and no '/' (so no path). INVALID_ARGUMENT naming `what` otherwise.
inline absl::Status CheckFileName(absl::string_view name, absl::string_view what) {
  bool ok = !name.empty() && name.size() <= 200 && name[0] != '.';
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '=' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " '", name,
      "' is not a file name: use 1-200 letters, digits, '.', '_', '=' or '-', not starting with "
      "'.' (a name, not a path: files go only into the job's own directory)"));
}

// "job:<id>/<name>" split; false when `reference` is not of that form.
inline bool SplitJobFileReference(absl::string_view reference, std::string* job_id,
                                  std::string* name) {
  if (!IsJobFileReference(reference)) return false;
  absl::string_view rest = reference.substr(kJobFilePrefix.size());
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos || slash == 0) return false;
  *job_id = std::string(rest.substr(0, slash));
  *name = std::string(rest.substr(slash + 1));
  return CheckFileName(*name, "").ok();
}

// An http:// or https:// URL (the scheme in any case).
inline bool IsHttpUrl(absl::string_view s) {
  return absl::StartsWithIgnoreCase(s, "http://") || absl::StartsWithIgnoreCase(s, "https://");
}

// A worker path without its mark; any other path as it is.
inline std::string WithoutWorkerMark(absl::string_view path) {
  return std::string(IsWorkerPath(path) ? path.substr(kWorkerPathPrefix.size()) : path);
}

}  // namespace dtrain

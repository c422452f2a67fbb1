#include "client/job_files.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/directories.h"
#include "common/file_reference.h"

namespace dtrain {

absl::StatusOr<std::vector<v1::JobFile>> SelectJobFiles(const v1::JobStatus& job,
                                                        const std::string& which) {
  const auto& files = job.files();
  if (which.empty() || which == "all") {
    if (files.empty()) {
      return absl::NotFoundError(absl::StrCat("job '", job.id(), "' keeps no files (yet)"));
    }
    return std::vector<v1::JobFile>(files.begin(), files.end());
  }
  auto pick = [&](auto&& matches) -> const v1::JobFile* {
    for (const v1::JobFile& file : files) {
      if (matches(file)) return &file;
    }
    return nullptr;
  };
  const v1::JobFile* found = nullptr;
  if (which == "best") {
    const std::string& best =
        job.best_checkpoint().empty() ? job.checkpoint() : job.best_checkpoint();
    found = pick([&](const v1::JobFile& f) { return f.location() == best; });
  } else if (which == "last") {
    found = pick([&](const v1::JobFile& f) { return f.location() == job.checkpoint(); });
  } else if (which == "predictions") {
    // All of them: predictions.pt, its batch_indices.pt and predictions.csv.
    std::vector<v1::JobFile> all;
    for (const v1::JobFile& file : files) {
      if (file.kind() == "predictions") all.push_back(file);
    }
    if (!all.empty()) return all;
  } else {
    found = pick([&](const v1::JobFile& f) { return f.name() == which; });
  }
  if (found != nullptr) return std::vector<v1::JobFile>{*found};
  std::vector<std::string> names;
  for (const v1::JobFile& file : files) names.push_back(file.name());
  return absl::NotFoundError(absl::StrCat(
      "job '", job.id(), "' has no ", which == "best" || which == "last" ? "" : "file ", "'", which,
      "'", which == "best" || which == "last" ? " checkpoint" : "", "; it keeps ",
      names.empty() ? "none" : absl::StrJoin(names, ", "),
      " (ask for best, last, predictions or one of those names)"));
}

absl::StatusOr<std::string> DownloadJobFile(ArtifactsClient& artifacts, const v1::JobFile& file,
                                            const std::string& dir) {
  // The name comes from the coordinator: it must not step out of `dir`.
  if (absl::Status s = CheckFileName(file.name(), "the job's file"); !s.ok()) return s;
  if (file.digest().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.name(), " is on the workers' shared directory, not on the coordinator: ",
                     file.location(), " (copy it from there)"));
  }
  if (absl::Status s = MakeDirectories(dir, "the download directory"); !s.ok()) return s;
  const std::string path = absl::StrCat(dir, "/", file.name());
  // Bytes that do not hash to the digest (DATA_LOSS) or a transfer that broke (UNAVAILABLE) are
  // fetched again, as the workers' cache and the Python client do: kAttempts in all.
  absl::Status fetched;
  int attempt = 0;
  do {
    fetched = artifacts.Fetch(file.digest(), path);
  } while (++attempt < ArtifactsClient::kAttempts &&
           (fetched.code() == absl::StatusCode::kDataLoss ||
            fetched.code() == absl::StatusCode::kUnavailable));
  if (!fetched.ok()) {
    return absl::Status(fetched.code(),
                        absl::StrCat("cannot download ", file.name(), " (", file.digest(), ")",
                                     attempt > 1 ? absl::StrCat(" in ", attempt, " attempts") : "",
                                     ": ", fetched.message()));
  }
  return path;
}

}  // namespace dtrain

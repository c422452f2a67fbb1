#include "coordinator/jobs/job_artifacts.h"

#include "common/file_reference.h"
#include "common/job_settings.h"

namespace dtrain {

std::vector<std::pair<std::string, std::string>> SpecArtifacts(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const SpecPath& p : SpecPaths(spec)) {
    if (IsArtifactReference(p.value)) out.emplace_back(p.path, ArtifactDigest(p.value));
  }
  return out;
}

std::set<std::string> DigestsNamedBy(const JobRecord& job) {
  std::set<std::string> named;
  for (const auto& [field, digest] : SpecArtifacts(job.spec())) named.insert(digest);
  const std::string resume = job.ckpt_path();
  if (IsArtifactReference(resume)) named.insert(ArtifactDigest(resume));
  for (const v1::JobFile& file : job.Files()) {
    if (!file.digest().empty()) named.insert(file.digest());
  }
  return named;
}

}  // namespace dtrain

#include "coordinator/jobs/job_artifacts.h"

#include "common/file_reference.h"

namespace dtrain {

std::vector<std::pair<std::string, std::string>> SpecArtifacts(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](const char* field, const std::string& value) {
    if (IsArtifactReference(value)) out.emplace_back(field, ArtifactDigest(value));
  };
  add("model.torchscript", spec.model().torchscript());
  add("data.tensors_file", spec.data().tensors_file());
  add("data.data_dir", spec.data().data_dir());
  add("ckpt_path", spec.ckpt_path());
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

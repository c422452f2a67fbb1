// JobManager's side of the stored files jobs name: freeing what no job names any more, resolving
// job:<id>/<name> references, and which files a run's group may fetch. Job lifecycle (submit,
// schedule, run, cancel, delete) is in job_manager.cc.
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_reference.h"
#include "common/job_settings.h"
#include "common/shard_list.h"
#include "coordinator/jobs/job_artifacts.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_record.h"

namespace dtrain {
namespace {

constexpr size_t kCachedShardLists = 64;

}  // namespace

void JobManager::SetArtifactStore(ArtifactStore* artifacts) { artifacts_ = artifacts; }

void JobManager::Track(const std::shared_ptr<JobRecord>& job) {
  job->SetFilesDropped([this](std::vector<std::string> digests) {
    int removed = 0;
    FreeUnused(digests, &removed);
  });
}

std::set<std::string> JobManager::NamedDigests() const {
  std::vector<std::shared_ptr<JobRecord>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  std::set<std::string> named;
  for (const auto& job : jobs) named.merge(DigestsNamedBy(*job));
  return named;
}

int64_t JobManager::FreeUnused(const std::vector<std::string>& digests, int* removed) {
  if (artifacts_ == nullptr || digests.empty()) return 0;
  absl::MutexLock freeing(&free_mu_);
  const std::set<std::string> named = NamedDigests();
  int64_t freed = 0;
  for (const std::string& digest : digests) {
    if (named.count(digest) > 0) continue;
    absl::StatusOr<int64_t> size = artifacts_->Size(digest);
    if (!size.ok()) continue;
    if (artifacts_->Delete(digest).ok()) {
      freed += *size;
      ++*removed;
    }
  }
  return freed;
}

absl::StatusOr<std::string> JobManager::ResolveFile(const std::string& reference) const {
  if (!IsJobFileReference(reference)) return reference;
  std::string job_id, name;
  if (!SplitJobFileReference(reference, &job_id, &name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", reference,
                     "' is not a job file reference; write job:<job id>/<file name>, e.g. "
                     "job:fashion-cnn-1/last.ckpt (dtrain results JOB lists its files)"));
  }
  std::shared_ptr<JobRecord> job = Find(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("'", reference, "': no job '", job_id, "' (deleted?); see dtrain list"));
  }
  std::vector<std::string> names;
  for (const v1::JobFile& file : job->Files()) {
    if (file.name() == name) {
      return file.digest().empty() ? file.location() : ArtifactReference(file.digest());
    }
    names.push_back(file.name());
  }
  return absl::NotFoundError(absl::StrCat("'", reference, "': job '", job_id, "' keeps no file '",
                                          name, "'; it keeps ",
                                          names.empty() ? "none" : absl::StrJoin(names, ", ")));
}

std::shared_ptr<const std::set<std::string>> JobManager::UploadedShards(
    const std::string& list) const {
  {
    absl::MutexLock lock(&shard_lists_mu_);
    auto it = shard_lists_.find(list);
    if (it != shard_lists_.end()) return it->second;
  }
  if (artifacts_ == nullptr) return nullptr;
  // One list read at a time: a job's ranks all ask at once, and one of them reads it for all.
  absl::MutexLock loading(&shard_lists_load_mu_);
  {
    absl::MutexLock lock(&shard_lists_mu_);
    auto it = shard_lists_.find(list);
    if (it != shard_lists_.end()) return it->second;
  }
  absl::StatusOr<int64_t> size = artifacts_->Size(list);
  absl::StatusOr<std::string> path = artifacts_->PathOf(list);
  if (!size.ok() || !path.ok()) return nullptr;
  // A list someone uploaded: read and parsed with the same bounds as on a worker. One too large
  // or that does not parse names no shard (the job's ranks report why).
  auto shards = std::make_shared<std::set<std::string>>();
  if (*size <= static_cast<int64_t>(kMaxShardListBytes)) {
    std::ifstream in(*path, std::ios::binary);
    std::string text(static_cast<size_t>(*size), '\0');
    if (!in.read(text.data(), static_cast<std::streamsize>(text.size()))) return nullptr;
    absl::StatusOr<std::vector<ShardEntry>> entries = ParseShardList(text);
    if (entries.ok()) {
      for (const ShardEntry& e : *entries) {
        if (IsArtifactReference(e.location)) shards->insert(ArtifactDigest(e.location));
      }
    }
  }
  absl::MutexLock lock(&shard_lists_mu_);
  if (shard_lists_.size() >= kCachedShardLists) shard_lists_.clear();
  shard_lists_[list] = shards;
  return shards;
}

bool JobManager::GroupMayRead(const std::string& group, const std::string& digest) const {
  // A run's group is the job's id, or "<id>.<run>" for a later run.
  std::shared_ptr<JobRecord> job = Find(group);
  if (job == nullptr && group.rfind('.') != std::string::npos) {
    job = Find(group.substr(0, group.rfind('.')));
  }
  if (job == nullptr) return false;
  if (DigestsNamedBy(*job).count(digest) > 0) return true;
  // A rank in a child process fetches the shards of an uploaded dataset one by one.
  for (const SpecPath& p : SpecPaths(job->spec())) {
    if (p.kind != v1::Setting::SHARDS || !IsArtifactReference(p.value)) continue;
    std::shared_ptr<const std::set<std::string>> shards = UploadedShards(ArtifactDigest(p.value));
    if (shards != nullptr && shards->count(digest) > 0) return true;
  }
  return false;
}

}  // namespace dtrain

#include "worker/service/artifact_cache.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/directories.h"
#include "common/sha256.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

std::string FileName(const std::string& digest) { return digest.substr(7); }  // the hex

}  // namespace

ArtifactCache::ArtifactCache(std::string dir, int64_t max_bytes, Fetcher fetch)
    : dir_(std::move(dir)), max_bytes_(max_bytes), fetch_(std::move(fetch)) {
  // Files a previous run of this worker kept are used again (oldest first in LRU order);
  // partial fetches are dropped.
  std::error_code error;
  absl::MutexLock lock(&mu_);
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (CheckDigest("sha256:" + name).ok()) {
      const int64_t size = static_cast<int64_t>(entry.file_size(error));
      entries_["sha256:" + name] = Entry{size, clock_++};
      bytes_ += size;
    } else {
      fs::remove(entry.path(), error);
    }
  }
}

absl::StatusOr<std::string> ArtifactCache::Get(const std::string& digest) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  const std::string path = absl::StrCat(dir_, "/", FileName(digest));
  absl::MutexLock fetching(&fetch_mu_);
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(digest);
    if (it != entries_.end() && fs::exists(path)) {
      it->second.last_use = clock_++;
      ++hits_;
      return path;
    }
    if (it != entries_.end()) {  // removed behind our back
      bytes_ -= it->second.size;
      entries_.erase(it);
    }
    ++misses_;
  }
  if (absl::Status s = MakePrivateDirectory(dir_, "the worker's artifact cache"); !s.ok()) return s;
  absl::Status fetched;
  int attempt = 0;
  do {
    fetched = fetch_(digest, path);
  } while (++attempt < kFetchAttempts && (fetched.code() == absl::StatusCode::kDataLoss ||
                                          fetched.code() == absl::StatusCode::kUnavailable));
  if (!fetched.ok()) {
    return absl::Status(fetched.code(),
                        absl::StrCat("cannot fetch ", digest, " from the coordinator",
                                     attempt > 1 ? absl::StrCat(" (", attempt, " attempts)") : "",
                                     ": ", fetched.message()));
  }
  std::error_code error;
  const int64_t size = static_cast<int64_t>(fs::file_size(path, error));
  absl::MutexLock lock(&mu_);
  EvictLocked(size);
  entries_[digest] = Entry{size, clock_++};
  bytes_ += size;
  return path;
}

absl::Status ArtifactCache::Adopt(const std::string& path, const std::string& digest) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  if (absl::Status s = MakePrivateDirectory(dir_, "the worker's artifact cache"); !s.ok()) return s;
  std::error_code error;
  const int64_t size = static_cast<int64_t>(fs::file_size(path, error));
  if (error) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", error.message()));
  absl::MutexLock fetching(&fetch_mu_);
  absl::MutexLock lock(&mu_);
  const std::string target = absl::StrCat(dir_, "/", FileName(digest));
  fs::rename(path, target, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot move ", path, " into the cache ", dir_, ": ", error.message()));
  }
  auto it = entries_.find(digest);
  if (it != entries_.end()) {
    bytes_ -= it->second.size;
    entries_.erase(it);
  }
  EvictLocked(size);
  entries_[digest] = Entry{size, clock_++};
  bytes_ += size;
  return absl::OkStatus();
}

void ArtifactCache::EvictLocked(int64_t keep_free) {
  while (max_bytes_ > 0 && bytes_ + keep_free > max_bytes_ && !entries_.empty()) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    std::error_code error;
    // A job still reading it keeps its open descriptor; the name goes.
    fs::remove(absl::StrCat(dir_, "/", FileName(oldest->first)), error);
    bytes_ -= oldest->second.size;
    entries_.erase(oldest);
  }
}

int64_t ArtifactCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}
int64_t ArtifactCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}
int64_t ArtifactCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace dtrain

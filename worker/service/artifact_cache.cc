#include "worker/service/artifact_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/directories.h"
#include "common/log.h"
#include "common/sha256.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

std::string FileName(const std::string& digest) { return digest.substr(7); }  // the hex

// A write inside one tick of the filesystem's clock leaves the ctime as it was (before Linux
// 6.13's fine-grained timestamps), so a seal taken this close to its file's last change is not
// trusted: the next use hashes the file again (as git does with "racily clean" index entries).
constexpr int64_t kRacyWindowNs = 100'000'000;

int64_t CtimeNs(const struct stat& st) {
  return int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
}

}  // namespace

ArtifactCache::Seal ArtifactCache::SealOf(const struct stat& st) {
  Seal seal;
  seal.device = st.st_dev;
  seal.inode = st.st_ino;
  seal.size = st.st_size;
  seal.ctime_ns = CtimeNs(st);
  return seal;
}

ArtifactCache::Seal ArtifactCache::Verify(const std::string& path, const std::string& digest) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Seal{};
  struct stat st;
  Seal seal;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    // Read-only, so that a slip cannot change it (the owner may make it writable again, which
    // changes its ctime).
    if ((st.st_mode & 07777) != 0400 && (::fchmod(fd, 0400) != 0 || ::fstat(fd, &st) != 0)) {
      ::close(fd);
      return Seal{};
    }
    seal = SealOf(st);
    if (!digest.empty()) {
      // Other bytes, or bytes that changed while they were read: not what `digest` names.
      const absl::StatusOr<std::string> hashed = Sha256OfDescriptor(fd);
      if (!hashed.ok() || *hashed != digest || ::fstat(fd, &st) != 0 || !(SealOf(st) == seal)) {
        seal = Seal{};
      }
    }
  }
  ::close(fd);
  timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
  seal.firm = seal.size >= 0 && now_ns - seal.ctime_ns > kRacyWindowNs;
  return seal;
}

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
      entries_["sha256:" + name] = Entry{size, clock_++, Seal{}};
      bytes_ += size;
    } else {
      fs::remove(entry.path(), error);
    }
  }
}

absl::StatusOr<std::string> ArtifactCache::Get(const std::string& digest) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  const std::string path = absl::StrCat(dir_, "/", FileName(digest));
  // Serializes Get and Adopt: the entries change only under it (and mu_), so what is read here
  // holds while the file is checked outside mu_.
  absl::MutexLock fetching(&fetch_mu_);
  std::optional<Seal> sealed;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(digest);
    if (it != entries_.end()) sealed = it->second.seal;
  }
  if (sealed.has_value()) {
    struct stat st;
    const bool present = ::lstat(path.c_str(), &st) == 0;
    Seal checked;
    if (present && S_ISREG(st.st_mode) && sealed->firm && SealOf(st) == *sealed) {
      checked = *sealed;
    } else if (present) {
      // Changed since it was checked, checked too soon after a change, or never checked by
      // this process: its bytes are hashed again before a job may use them.
      checked = Verify(path, digest);
    }
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(digest);
    if (checked.size >= 0) {
      it->second.seal = checked;
      it->second.last_use = clock_++;
      ++hits_;
      return path;
    }
    // Gone, or no longer what `digest` names: never handed to a job, fetched again.
    if (present) {
      if (sealed->size >= 0) ++tampered_;
      std::error_code error;
      fs::remove(path, error);
      LogWarning("a cached file no longer holds what its digest names; fetching it again",
                 {{"digest", digest}, {"path", path}});
    }
    bytes_ -= it->second.size;
    entries_.erase(it);
  }
  {
    absl::MutexLock lock(&mu_);
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
  // The fetch checked the bytes against the digest before renaming them into place.
  const Seal seal = Verify(path, "");
  if (seal.size < 0) {
    return absl::InternalError(
        absl::StrCat("the fetched copy of ", digest, " at ", path, " is not a regular file"));
  }
  absl::MutexLock lock(&mu_);
  EvictLocked(seal.size);
  entries_[digest] = Entry{seal.size, clock_++, seal};
  bytes_ += seal.size;
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
  // Unchecked: a rank could still change the file between its upload and here, so its first use
  // hashes it.
  entries_[digest] = Entry{size, clock_++, Seal{}};
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
int64_t ArtifactCache::tampered() const {
  absl::MutexLock lock(&mu_);
  return tampered_;
}
int64_t ArtifactCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace dtrain

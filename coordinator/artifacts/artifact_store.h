// ArtifactStore: the coordinator's content-addressed files (the models, datasets and
// checkpoints jobs carry when client, coordinator and workers share no filesystem). A file is
// named by its SHA-256 ("sha256:<hex>"), written by streaming into a temporary file while
// hashing, and kept only when its bytes hash to the digest the sender announced; so a file is
// stored once however many jobs name it, and a truncated or corrupted transfer never becomes a
// stored file. Sizes are bounded per file and in total (the operator's quota).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"

namespace dtrain {

struct ArtifactStoreOptions {
  std::string dir;               // objects/ and incoming/ live here
  int64_t max_object_bytes = 0;  // 0: no per-file limit
  int64_t quota_bytes = 0;       // 0: no total limit
};

class ArtifactStore {
 public:
  // Creates the directories, drops interrupted uploads (untouched for 10 minutes) and counts
  // what is stored.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(ArtifactStoreOptions options);

  // One upload in progress. Destroying it before Commit discards it and frees its reservation.
  class Writer {
   public:
    ~Writer();
    // INVALID_ARGUMENT past the announced size.
    absl::Status Append(absl::string_view bytes);
    // Checks size and digest and stores the file (a file already there is kept as it is).
    // DATA_LOSS when the bytes do not hash to `digest` or fall short of the announced size.
    absl::Status Commit();

   private:
    friend class ArtifactStore;
    Writer(ArtifactStore* store, std::string digest, int64_t size, std::string temp_path);
    ArtifactStore* store_;
    const std::string digest_;
    const int64_t size_;
    const std::string temp_path_;
    std::FILE* file_ = nullptr;
    Sha256 hash_;
    int64_t written_ = 0;
    bool done_ = false;
  };

  // Starts an upload of `size` bytes said to hash to `digest`. INVALID_ARGUMENT: a malformed
  // digest or a negative size; RESOURCE_EXHAUSTED: above the per-file limit or the quota (the
  // message says which flag sets it).
  absl::StatusOr<std::unique_ptr<Writer>> NewWriter(const std::string& digest, int64_t size);

  // Stores a file the coordinator itself wrote (a job's predictions.csv), under the same
  // limits as an upload; returns its digest.
  absl::StatusOr<std::string> ImportFile(const std::string& path);

  // The stored file's size; NOT_FOUND when it is not stored (INVALID_ARGUMENT if malformed).
  absl::StatusOr<int64_t> Size(const std::string& digest) const;
  // Where the stored file is, for reading.
  absl::StatusOr<std::string> PathOf(const std::string& digest) const;
  // Removes a stored file; NOT_FOUND when it is not there.
  absl::Status Delete(const std::string& digest);

  int64_t stored_bytes() const;
  const ArtifactStoreOptions& options() const { return options_; }

 private:
  explicit ArtifactStore(ArtifactStoreOptions options) : options_(std::move(options)) {}
  std::string ObjectPath(const std::string& digest) const;
  void Release(int64_t reserved, int64_t stored);

  const ArtifactStoreOptions options_;
  mutable absl::Mutex mu_;
  int64_t stored_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_upload_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dtrain

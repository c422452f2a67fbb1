#include "coordinator/artifacts/artifact_store.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/directories.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(ArtifactStoreOptions options) {
  // Stored files are trusted by every later job that names their digest: only this user's.
  if (absl::Status s = MakePrivateDirectory(options.dir, "the artifact store"); !s.ok()) return s;
  if (absl::Status s = MakeDirectories(options.dir + "/objects", "the artifact store"); !s.ok()) {
    return s;
  }
  if (absl::Status s = MakeDirectories(options.dir + "/incoming", "the artifact store"); !s.ok()) {
    return s;
  }
  // Uploads a stop interrupted: untouched for a while (another coordinator sharing the
  // directory may be writing the recent ones).
  std::error_code error;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& entry : fs::directory_iterator(options.dir + "/incoming", error)) {
    if (now - entry.last_write_time(error) > std::chrono::minutes(10)) fs::remove(entry, error);
  }
  std::unique_ptr<ArtifactStore> store(new ArtifactStore(std::move(options)));
  int64_t total = 0;
  for (auto it = fs::recursive_directory_iterator(store->options_.dir + "/objects", error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_regular_file(error)) total += static_cast<int64_t>(it->file_size(error));
  }
  absl::MutexLock lock(&store->mu_);
  store->stored_bytes_ = total;
  return store;
}

std::string ArtifactStore::ObjectPath(const std::string& digest) const {
  const std::string hex = digest.substr(7);  // after "sha256:"
  return absl::StrCat(options_.dir, "/objects/", hex.substr(0, 2), "/", hex.substr(2));
}

absl::StatusOr<std::unique_ptr<ArtifactStore::Writer>> ArtifactStore::NewWriter(
    const std::string& digest, int64_t size) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat("size ", size, " is negative"));
  if (options_.max_object_bytes > 0 && size > options_.max_object_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the file is ", size, " bytes, more than the coordinator accepts per file (",
                     options_.max_object_bytes,
                     ", its --max_artifact_bytes); ask its operator, or keep the "
                     "file on the workers and name it as a worker path"));
  }
  std::string temp;
  {
    absl::MutexLock lock(&mu_);
    if (options_.quota_bytes > 0 && stored_bytes_ + reserved_bytes_ + size > options_.quota_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "storing ", size, " more bytes would exceed the coordinator's artifact quota (",
          options_.quota_bytes, " bytes, its --artifact_quota_bytes; ", stored_bytes_, " stored, ",
          reserved_bytes_, " being uploaded); delete ended jobs (dtrain delete)"));
    }
    reserved_bytes_ += size;
    temp = absl::StrCat(options_.dir, "/incoming/", getpid(), "-", next_upload_++);
  }
  // Created exclusively under a random name: nothing already in incoming/ is written through.
  absl::StatusOr<FileBeside> part = CreateFileBeside(temp);
  if (!part.ok()) {
    Release(size, 0);
    return absl::InternalError(
        absl::StrCat("cannot store an upload in the artifact store: ", part.status().message()));
  }
  std::unique_ptr<Writer> writer(new Writer(this, digest, size, part->path));
  writer->file_ = part->file;
  return writer;
}

ArtifactStore::Writer::Writer(ArtifactStore* store, std::string digest, int64_t size,
                              std::string temp_path)
    : store_(store), digest_(std::move(digest)), size_(size), temp_path_(std::move(temp_path)) {}

ArtifactStore::Writer::~Writer() {
  if (file_ != nullptr) std::fclose(file_);
  if (!done_) {
    std::remove(temp_path_.c_str());
    store_->Release(size_, 0);
  }
}

absl::Status ArtifactStore::Writer::Append(absl::string_view bytes) {
  if (done_) return absl::FailedPreconditionError("the upload is already committed");
  if (written_ + static_cast<int64_t>(bytes.size()) > size_) {
    return absl::InvalidArgumentError(absl::StrCat("the upload sends more than the ", size_,
                                                   " bytes it announced for ", digest_));
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot write to the artifact store: ", std::strerror(errno)));
  }
  hash_.Update(bytes);
  written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status ArtifactStore::Writer::Commit() {
  if (done_) return absl::FailedPreconditionError("the upload is already committed");
  if (written_ != size_) {
    return absl::DataLossError(absl::StrCat("the upload of ", digest_, " ended after ", written_,
                                            " of its ", size_, " bytes; send it again"));
  }
  const std::string actual = hash_.Finish();
  if (actual != digest_) {
    return absl::DataLossError(absl::StrCat("the uploaded bytes hash to ", actual, ", not ",
                                            digest_, ": corrupted in transit; send it again"));
  }
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot write to the artifact store: ", std::strerror(errno)));
  }
  std::fclose(file_);
  file_ = nullptr;
  const std::string target = store_->ObjectPath(digest_);
  std::error_code error;
  fs::create_directories(fs::path(target).parent_path(), error);
  const bool existed = fs::exists(target, error);
  if (!existed && std::rename(temp_path_.c_str(), target.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot store ", digest_, " at '", target, "': ", std::strerror(errno)));
  }
  if (existed) std::remove(temp_path_.c_str());
  done_ = true;
  store_->Release(size_, existed ? 0 : size_);
  return absl::OkStatus();
}

void ArtifactStore::Release(int64_t reserved, int64_t stored) {
  absl::MutexLock lock(&mu_);
  reserved_bytes_ -= reserved;
  stored_bytes_ += stored;
}

absl::StatusOr<std::string> ArtifactStore::ImportFile(const std::string& path) {
  DTRAIN_ASSIGN_OR_RETURN(std::string digest, Sha256OfFile(path));
  std::error_code error;
  const int64_t size = static_cast<int64_t>(fs::file_size(path, error));
  if (error) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer, NewWriter(digest, size));
  std::ifstream in(path, std::ios::binary);
  std::string chunk(1 << 20, '\0');
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    DTRAIN_RETURN_IF_ERROR(
        writer->Append(absl::string_view(chunk.data(), static_cast<size_t>(in.gcount()))));
  }
  DTRAIN_RETURN_IF_ERROR(writer->Commit());
  return digest;
}

absl::StatusOr<int64_t> ArtifactStore::Size(const std::string& digest) const {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  std::error_code error;
  const auto size = fs::file_size(ObjectPath(digest), error);
  if (error) return absl::NotFoundError(absl::StrCat(digest, " is not stored"));
  return static_cast<int64_t>(size);
}

absl::StatusOr<std::string> ArtifactStore::PathOf(const std::string& digest) const {
  if (absl::StatusOr<int64_t> size = Size(digest); !size.ok()) return size.status();
  return ObjectPath(digest);
}

absl::Status ArtifactStore::Delete(const std::string& digest) {
  absl::StatusOr<int64_t> size = Size(digest);
  if (!size.ok()) return size.status();
  if (std::remove(ObjectPath(digest).c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot delete ", digest, ": ", std::strerror(errno)));
  }
  Release(0, -*size);
  return absl::OkStatus();
}

int64_t ArtifactStore::stored_bytes() const {
  absl::MutexLock lock(&mu_);
  return stored_bytes_;
}

}  // namespace dtrain

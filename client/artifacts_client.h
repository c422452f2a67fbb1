// ArtifactsClient: files in and out of the coordinator's content-addressed store (the
// Artifacts service). Upload hashes a local file, asks whether the coordinator has it and sends
// it only if not; Fetch streams a stored file to a local path and keeps it only when its bytes
// hash to the digest asked for. Every message fits gRPC's default 4 MiB.
//
// Thread-safety: one ArtifactsClient may be used from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dtrain/v1/artifacts.grpc.pb.h"

namespace dtrain {

struct UploadResult {
  std::string digest;  // "sha256:<hex>"
  int64_t size = 0;
  bool sent = false;  // false: the coordinator had it already and nothing was sent
};

class ArtifactsClient {
 public:
  // `base_timeout` plus the transfer at a floor of 50 MB/s is each call's deadline.
  // `wait_for_ready`: a call waits (within that deadline) for an unreachable coordinator to come
  // back instead of failing at once; a daemon wants that (its coordinator may be restarting),
  // a command line does not.
  explicit ArtifactsClient(std::shared_ptr<grpc::Channel> channel,
                           absl::Duration base_timeout = absl::Seconds(60),
                           bool wait_for_ready = false);

  // NOT_FOUND: no such local file. A transfer the coordinator finds corrupted (DATA_LOSS) or
  // that breaks (UNAVAILABLE) is sent again, kAttempts in all; its other refusals
  // (RESOURCE_EXHAUSTED above its limits) come back as they are, naming the file.
  absl::StatusOr<UploadResult> Upload(const std::string& path);
  // Writes `path` atomically (a temporary file beside it, renamed). DATA_LOSS when the bytes
  // do not hash to `digest` (nothing is kept); NOT_FOUND when the coordinator has no such file.
  absl::Status Fetch(const std::string& digest, const std::string& path);
  // The stored size; NOT_FOUND when it is not stored.
  absl::StatusOr<int64_t> Stat(const std::string& digest);

  static constexpr int kAttempts = 3;

 private:
  absl::Status Send(const std::string& path, UploadResult* result);
  absl::Time Deadline(int64_t bytes) const;

  std::unique_ptr<v1::Artifacts::Stub> stub_;
  const absl::Duration base_timeout_;
  const bool wait_for_ready_;
};

}  // namespace dtrain

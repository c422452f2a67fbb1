// The Artifacts gRPC edge (proto/dtrain/v1/artifacts.proto) over an ArtifactStore: uploads
// stream into a verifying writer, fetches stream a stored file out in 4 MiB - 64 KiB chunks.
// Callback reactors, so a slow client holds no server thread. Uploads need the cluster's admin
// token. Stat and Fetch take the admin token, or a job token for the files of that token's job
// only (its uploaded model and data, its checkpoints and predictions).
#pragma once

#include <functional>
#include <string>

#include "coordinator/artifacts/artifact_store.h"
#include "coordinator/auth/access_control.h"
#include "dtrain/v1/artifacts.grpc.pb.h"

namespace dtrain {

// Upload is served raw (artifacts_service.cc says why); Stat and Fetch typed.
class ArtifactsService final
    : public v1::Artifacts::WithRawCallbackMethod_Upload<v1::Artifacts::WithCallbackMethod_Stat<
          v1::Artifacts::WithCallbackMethod_Fetch<v1::Artifacts::Service>>> {
 public:
  // Whether a job token of `group` may read `digest` (JobManager::GroupMayRead).
  using GroupMayRead = std::function<bool(const std::string& group, const std::string& digest)>;

  ArtifactsService(ArtifactStore* store, const AccessControl* access,
                   GroupMayRead group_may_read = nullptr)
      : store_(store), access_(access), group_may_read_(std::move(group_may_read)) {}

  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context,
                                 const v1::StatRequest* request,
                                 v1::StatResponse* response) override;
  grpc::ServerWriteReactor<v1::FetchResponse>* Fetch(grpc::CallbackServerContext* context,
                                                     const v1::FetchRequest* request) override;

 private:
  absl::Status MayRead(const grpc::ServerContextBase& context, const std::string& digest,
                       const char* what) const;

  ArtifactStore* const store_;
  const AccessControl* const access_;
  const GroupMayRead group_may_read_;
};

}  // namespace dtrain

// The Artifacts gRPC edge (proto/dtrain/v1/artifacts.proto) over an ArtifactStore: uploads
// stream into a verifying writer, fetches stream a stored file out in 4 MiB - 64 KiB chunks.
// Callback reactors, so a slow client holds no server thread. Uploads need the cluster's admin
// token; so do Stat and Fetch for now (job tokens reading their own job's files come with the
// jobs that name them).
#pragma once

#include "coordinator/artifacts/artifact_store.h"
#include "coordinator/collectives/access_control.h"
#include "dtrain/v1/artifacts.grpc.pb.h"

namespace dtrain {

class ArtifactsService final : public v1::Artifacts::CallbackService {
 public:
  ArtifactsService(ArtifactStore* store, const AccessControl* access)
      : store_(store), access_(access) {}

  grpc::ServerReadReactor<v1::UploadRequest>* Upload(grpc::CallbackServerContext* context,
                                                     v1::UploadResponse* response) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context,
                                 const v1::StatRequest* request,
                                 v1::StatResponse* response) override;
  grpc::ServerWriteReactor<v1::FetchResponse>* Fetch(grpc::CallbackServerContext* context,
                                                     const v1::FetchRequest* request) override;

 private:
  ArtifactStore* const store_;
  const AccessControl* const access_;
};

}  // namespace dtrain

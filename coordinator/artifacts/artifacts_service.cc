#include "coordinator/artifacts/artifacts_service.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/callback_reactors.h"
#include "common/grpc_status.h"
#include "common/raw_request.h"
#include "common/streaming.h"

namespace dtrain {
namespace {

// Reads messages until the client half-closes; the first must hold the header. Served raw, so
// that a message whose bytes do not parse is refused by name: a typed stream would only see its
// reads end, and call the upload short.
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(ArtifactStore* store, grpc::ByteBuffer* response, const absl::Status& allowed)
      : store_(store), response_bytes_(response) {
    if (!allowed.ok()) {
      Finish(ToGrpcStatus(allowed));
      return;
    }
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client sent everything
      if (already_stored_) {
        FinishWithResponse();
        return;
      }
      if (writer_ == nullptr) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError("the upload sent no header")));
        return;
      }
      if (absl::Status s = writer_->Commit(); !s.ok()) {
        Finish(ToGrpcStatus(s));
        return;
      }
      FinishWithResponse();
      return;
    }
    absl::Status parsed = ParseRequestInto(read_, "/dtrain.v1.Artifacts/Upload", &request_);
    read_.Clear();  // the chunk is request_'s now: not held twice until the next arrives
    if (!parsed.ok()) {
      Finish(ToGrpcStatus(parsed));
      return;
    }
    if (writer_ == nullptr && !already_stored_) {
      if (!request_.has_header()) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError(
            "the first message of an upload carries its header (digest, size)")));
        return;
      }
      const v1::UploadHeader& h = request_.header();
      response_.set_digest(h.digest());
      response_.set_size(h.size());
      absl::StatusOr<int64_t> stored = store_->Size(h.digest());
      if (stored.ok() && *stored == h.size()) {
        // Already here: read the rest and drop it (a client that did not Stat first).
        already_stored_ = true;
        response_.set_already_stored(true);
      } else {
        absl::StatusOr<std::unique_ptr<ArtifactStore::Writer>> writer =
            store_->NewWriter(h.digest(), h.size());
        if (!writer.ok()) {
          Finish(ToGrpcStatus(writer.status()));
          return;
        }
        writer_ = std::move(*writer);
      }
    } else if (request_.has_header()) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError("an upload carries one header, first")));
      return;
    }
    if (already_stored_) {
      // Dropped, but held to the same promise as a write: no more than the header announced.
      discarded_ += static_cast<int64_t>(request_.chunk().size());
      if (discarded_ > response_.size()) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError(
            absl::StrCat("the upload sends more than the ", response_.size(),
                         " bytes it announced for ", response_.digest()))));
        return;
      }
    }
    if (writer_ != nullptr && !request_.chunk().empty()) {
      if (absl::Status s = writer_->Append(request_.chunk()); !s.ok()) {
        Finish(ToGrpcStatus(s));
        return;
      }
    }
    StartRead(&read_);
  }

  void OnDone() override { delete this; }

 private:
  void FinishWithResponse() {
    grpc::Slice slice(response_.SerializeAsString());
    *response_bytes_ = grpc::ByteBuffer(&slice, 1);
    Finish(grpc::Status::OK);
  }

  ArtifactStore* const store_;
  grpc::ByteBuffer* const response_bytes_;
  v1::UploadResponse response_;
  grpc::ByteBuffer read_;
  v1::UploadRequest request_;
  std::unique_ptr<ArtifactStore::Writer> writer_;  // discarded unless committed
  bool already_stored_ = false;
  int64_t discarded_ = 0;  // bytes read and dropped after already_stored_
};

// Writes the file chunk by chunk, each after the previous was sent.
class FetchReactor final : public grpc::ServerWriteReactor<v1::FetchResponse> {
 public:
  FetchReactor(const ArtifactStore* store, const v1::FetchRequest& request,
               const absl::Status& allowed) {
    absl::StatusOr<int64_t> size = Open(store, request, allowed);
    if (!size.ok()) {
      Finish(ToGrpcStatus(size.status()));
      return;
    }
    response_.set_size(*size);
    remaining_ = *size - request.offset();
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the reader went away"));
      return;
    }
    response_.Clear();
    Next();
  }

  void OnDone() override {
    if (file_ != nullptr) std::fclose(file_);
    delete this;
  }

 private:
  // Opens the stored file at the request's offset; its size.
  absl::StatusOr<int64_t> Open(const ArtifactStore* store, const v1::FetchRequest& request,
                               const absl::Status& allowed) {
    if (!allowed.ok()) return allowed;
    absl::StatusOr<std::string> path = store->PathOf(request.digest());
    if (!path.ok()) return path.status();
    struct stat info;
    file_ = std::fopen(path->c_str(), "rb");
    if (file_ == nullptr || fstat(fileno(file_), &info) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot read ", request.digest(), ": ", std::strerror(errno)));
    }
    const int64_t size = static_cast<int64_t>(info.st_size);
    if (request.offset() < 0 || request.offset() > size) {
      return absl::InvalidArgumentError(
          absl::StrCat("offset ", request.offset(), " is outside the file's ", size, " bytes"));
    }
    if (std::fseek(file_, request.offset(), SEEK_SET) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot read ", request.digest(), ": ", std::strerror(errno)));
    }
    return size;
  }

  void Next() {
    if (remaining_ == 0 && sent_any_) {
      Finish(grpc::Status::OK);
      return;
    }
    const int64_t n = std::min<int64_t>(remaining_, kStreamChunkBytes);
    std::string* chunk = response_.mutable_chunk();
    chunk->resize(static_cast<size_t>(n));
    if (n > 0 && std::fread(chunk->data(), 1, chunk->size(), file_) != chunk->size()) {
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "the stored file ended early"));
      return;
    }
    remaining_ -= n;
    sent_any_ = true;
    StartWrite(&response_);
  }

  std::FILE* file_ = nullptr;
  v1::FetchResponse response_;
  int64_t remaining_ = 0;
  bool sent_any_ = false;
};

}  // namespace

absl::Status ArtifactsService::MayRead(const grpc::ServerContextBase& context,
                                       const std::string& digest, const char* what) const {
  absl::StatusOr<Caller> caller = access_->Authenticate(context);
  if (!caller.ok()) return caller.status();
  if (caller->admin()) return absl::OkStatus();
  if (group_may_read_ && group_may_read_(caller->group(), digest)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, ": a job token reads only its own job's files, and ", digest,
                   " is not one of job group '", caller->group(), "'s"));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ArtifactsService::Upload(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new UploadReactor(store_, response, access_->RequireAdmin(*context, "Upload"));
}

grpc::ServerUnaryReactor* ArtifactsService::Stat(grpc::CallbackServerContext* context,
                                                 const v1::StatRequest* request,
                                                 v1::StatResponse* response) {
  if (absl::Status s = MayRead(*context, request->digest(), "Stat"); !s.ok())
    return FinishNow(context, s);
  absl::StatusOr<int64_t> size = store_->Size(request->digest());
  if (!size.ok()) return FinishNow(context, size.status());
  response->set_digest(request->digest());
  response->set_size(*size);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::FetchResponse>* ArtifactsService::Fetch(
    grpc::CallbackServerContext* context, const v1::FetchRequest* request) {
  return new FetchReactor(store_, *request, MayRead(*context, request->digest(), "Fetch"));
}

}  // namespace dtrain

// The Worker service's checkpoint RPCs (SaveCheckpoint, LoadCheckpoint, StateDict) and the
// Setup's checkpoint directory: where a job's checkpoints are written on this worker, how a
// request's names become paths inside that directory, and the hand-off of a written checkpoint
// to the coordinator's store. The rest of the service (the executor, steps, teardown) is in
// worker_service.cc; StreamStateDict stays there, since it queues on the executor directly.
#include "worker/service/worker_service.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/directories.h"
#include "common/file_reference.h"
#include "common/status_macros.h"
#include "common/streaming.h"
#include "worker/service/request_limits.h"
#include "worker/service/setup_paths.h"

namespace dtrain {

absl::StatusOr<std::string> WorkerService::CheckpointDirectory(v1::SetupRequest* setup) {
  if (setup->store_checkpoints()) {
    if (options_.jobs_dir.empty() || !options_.store_file) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker '", options_.identity.name,
          "' cannot send checkpoints to the coordinator (it has no directory for jobs); name a "
          "checkpoint.dirpath the workers share instead"));
    }
    DTRAIN_RETURN_IF_ERROR(MakePrivateDirectory(options_.jobs_dir, "the worker's jobs directory"));
    // Its ranks (ddp_spawn children too) see a plain directory; only this daemon sends files.
    setup->set_store_checkpoints(false);
    setup->mutable_spec()->mutable_checkpoint()->set_dirpath(
        absl::StrCat(options_.jobs_dir, "/", setup->job_id(), "/checkpoints"));
  }
  return setup->spec().checkpoint().dirpath();
}

absl::StatusOr<std::string> WorkerService::CheckpointPath(const std::string& name,
                                                          const std::string& field) {
  DTRAIN_RETURN_IF_ERROR(CheckFileName(name, field));
  absl::MutexLock lock(&mu_);
  if (checkpoint_dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " '", name, "': the job set up on worker '", options_.identity.name,
                     "' has no checkpoint directory (only fit writes checkpoints)"));
  }
  return absl::StrCat(checkpoint_dir_, "/", name);
}

grpc::ServerUnaryReactor* WorkerService::SaveCheckpoint(grpc::CallbackServerContext* context,
                                                        const v1::SaveCheckpointRequest* request,
                                                        v1::SaveCheckpointResponse* response) {
  return Enqueue(context, [=]() -> absl::Status {
    DTRAIN_RETURN_IF_ERROR(CheckNames("monitored", request->monitored()));
    DTRAIN_RETURN_IF_ERROR(CheckCallbackStates(request->callbacks()));
    // A save evicts what fell out of save_top_k and the previous last.ckpt: a few names.
    constexpr int kMostRemoved = 256;
    if (request->remove_size() > kMostRemoved) {
      return absl::InvalidArgumentError(absl::StrCat("remove lists ", request->remove_size(),
                                                     " checkpoints; a save removes at most ",
                                                     kMostRemoved));
    }
    DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<HostedJob> job, JobFor(request->job_id()));
    DTRAIN_ASSIGN_OR_RETURN(const std::string path, CheckpointPath(request->name(), "checkpoint"));
    std::vector<std::string> evicted;
    for (const std::string& name : request->remove()) {
      DTRAIN_ASSIGN_OR_RETURN(evicted.emplace_back(), CheckpointPath(name, "remove"));
      if (evicted.back() == path) {
        return absl::InvalidArgumentError(
            absl::StrCat("remove names '", name,
                         "', the checkpoint this call writes; it would be deleted "
                         "as soon as it was saved"));
      }
    }
    DTRAIN_RETURN_IF_ERROR(Note(job->SaveCheckpoint(path, *request, response)));
    if (!absl::c_linear_search(response->written(), true)) return absl::OkStatus();
    // The rank that wrote it is in this worker: the file is here.
    std::error_code error;
    response->set_bytes(static_cast<int64_t>(std::filesystem::file_size(path, error)));
    for (const std::string& old : evicted) std::filesystem::remove(old, error);
    bool store = false;
    {
      absl::MutexLock lock(&mu_);
      store = store_checkpoints_;
    }
    if (!store) return absl::OkStatus();
    absl::StatusOr<std::string> digest = options_.store_file(path);
    if (!digest.ok()) {
      return absl::Status(
          digest.status().code(),
          absl::StrCat("checkpoint ", request->name(), " was written on worker '",
                       options_.identity.name,
                       "' but not sent to the coordinator: ", digest.status().message()));
    }
    response->set_digest(*digest);
    // Kept by content: a resume on this worker reads it without a transfer.
    if (options_.artifacts == nullptr || !options_.artifacts->Adopt(path, *digest).ok()) {
      std::filesystem::remove(path, error);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerService::LoadCheckpoint(grpc::CallbackServerContext* context,
                                                        const v1::LoadCheckpointRequest* request,
                                                        v1::LoadCheckpointResponse* response) {
  return Enqueue(context, [=]() -> absl::Status {
    DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<HostedJob> job, JobFor(request->job_id()));
    v1::LoadCheckpointRequest local = *request;
    // A bare name is a checkpoint of this job's own directory.
    if (!request->path().empty() && !IsMarkedPath(request->path()) &&
        request->path().find('/') == std::string::npos) {
      DTRAIN_ASSIGN_OR_RETURN(*local.mutable_path(), CheckpointPath(request->path(), "ckpt_path"));
    } else {
      DTRAIN_ASSIGN_OR_RETURN(*local.mutable_path(),
                              LocalPath(request->path(), "ckpt_path", options_.artifacts));
    }
    absl::Status loaded = job->LoadCheckpoint(local, response);
    if (!loaded.ok() && local.path() != request->path()) {
      // Name the file as the spec did, not by this worker's cache path.
      loaded = absl::Status(loaded.code(), absl::StrCat(request->path(), " (this worker's copy ",
                                                        local.path(), "): ", loaded.message()));
    }
    return Note(loaded);
  });
}

grpc::ServerUnaryReactor* WorkerService::StateDict(grpc::CallbackServerContext* context,
                                                   const v1::StateDictRequest* request,
                                                   v1::StateDictResponse* response) {
  auto read = [=]() -> absl::Status {
    DTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<HostedJob> job, JobFor(request->job_id()));
    DTRAIN_RETURN_IF_ERROR(job->StateDict(response));
    const size_t bytes = response->ByteSizeLong();
    if (bytes > static_cast<size_t>(kDefaultClientMaxMessageBytes)) {
      response->Clear();
      return absl::FailedPreconditionError(
          absl::StrCat("the state dict is ", bytes,
                       " bytes, more than one 4 MiB message a default client "
                       "accepts; read it with StreamStateDict"));
    }
    return absl::OkStatus();
  };
  WorkerTrainOrder neutral;
  neutral.neutral = true;  // a read: a pipelined training call may still follow across it
  return Enqueue(context, std::move(read), "", nullptr, std::move(neutral));
}

}  // namespace dtrain

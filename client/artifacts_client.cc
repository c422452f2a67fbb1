#include "client/artifacts_client.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/grpc_status.h"
#include "common/sha256.h"
#include "common/streaming.h"

namespace dtrain {

ArtifactsClient::ArtifactsClient(std::shared_ptr<grpc::Channel> channel,
                                 absl::Duration base_timeout, bool wait_for_ready)
    : stub_(v1::Artifacts::NewStub(std::move(channel))),
      base_timeout_(base_timeout),
      wait_for_ready_(wait_for_ready) {}

absl::Time ArtifactsClient::Deadline(int64_t bytes) const {
  return absl::Now() + base_timeout_ + absl::Seconds(static_cast<double>(bytes) / 50e6);
}

absl::StatusOr<int64_t> ArtifactsClient::Stat(const std::string& digest) {
  grpc::ClientContext context;
  context.set_wait_for_ready(wait_for_ready_);
  context.set_deadline(absl::ToChronoTime(Deadline(0)));
  v1::StatRequest request;
  request.set_digest(digest);
  v1::StatResponse response;
  grpc::Status status = stub_->Stat(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.size();
}

absl::StatusOr<UploadResult> ArtifactsClient::Upload(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) return absl::NotFoundError(absl::StrCat("cannot upload '", path, "': no such file"));
  absl::StatusOr<std::string> digest = Sha256OfFile(path);
  if (!digest.ok()) return digest.status();
  UploadResult result;
  result.digest = *digest;
  result.size = static_cast<int64_t>(size);
  // A transfer cut short or corrupted on the way is refused by the coordinator's hash check
  // (DATA_LOSS) and sent again, as is one whose connection broke (UNAVAILABLE); a file that
  // changes while it is read fails every attempt.
  absl::Status sent;
  int attempt = 0;
  while (true) {
    absl::StatusOr<int64_t> stored = Stat(*digest);
    if (stored.ok() && *stored == result.size) return result;
    sent = stored.ok() || stored.status().code() == absl::StatusCode::kNotFound
               ? Send(path, &result)
               : stored.status();
    if (sent.ok() || ++attempt >= kAttempts ||
        (sent.code() != absl::StatusCode::kDataLoss &&
         sent.code() != absl::StatusCode::kUnavailable)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200) * attempt);
  }
  if (!sent.ok()) {
    return absl::Status(sent.code(),
                        absl::StrCat("cannot upload '", path, "'",
                                     attempt > 1 ? absl::StrCat(" (", attempt, " attempts)") : "",
                                     ": ", sent.message()));
  }
  return result;
}

absl::Status ArtifactsClient::Send(const std::string& path, UploadResult* result) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  grpc::ClientContext context;
  context.set_wait_for_ready(wait_for_ready_);
  context.set_deadline(absl::ToChronoTime(Deadline(result->size)));
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      stub_->Upload(&context, &response);
  v1::UploadRequest request;
  request.mutable_header()->set_digest(result->digest);
  request.mutable_header()->set_size(result->size);
  request.mutable_header()->set_name(std::filesystem::path(path).filename().string());
  std::string* chunk = request.mutable_chunk();
  int64_t sent = 0;
  bool open = true;
  do {
    chunk->resize(static_cast<size_t>(kStreamChunkBytes));
    in.read(chunk->data(), static_cast<std::streamsize>(chunk->size()));
    chunk->resize(static_cast<size_t>(in.gcount()));
    sent += static_cast<int64_t>(chunk->size());
    open = writer->Write(request);  // false: the server ended the call (its status says why)
    request.clear_header();
  } while (open && sent < result->size && in);
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  result->sent = !response.already_stored();
  return absl::OkStatus();
}

absl::Status ArtifactsClient::Fetch(const std::string& digest, const std::string& path) {
  // The size first: the fetch's deadline grows with it.
  absl::StatusOr<int64_t> expected = Stat(digest);
  if (!expected.ok()) return expected.status();
  // A fresh name (mkostemp): a link or file someone placed at a guessable one is never opened.
  // 0644, as a download usually is (the worker's cache makes its copies read-only).
  absl::StatusOr<FileBeside> part = CreateFileBeside(path, 0644);
  if (!part.ok()) return part.status();
  const std::string temp = part->path;
  std::FILE* out = part->file;
  grpc::ClientContext context;
  context.set_wait_for_ready(wait_for_ready_);
  context.set_deadline(absl::ToChronoTime(Deadline(*expected)));
  v1::FetchRequest request;
  request.set_digest(digest);
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader = stub_->Fetch(&context, request);
  v1::FetchResponse response;
  Sha256 hash;
  int64_t size = -1, received = 0;
  absl::Status failure;
  while (reader->Read(&response)) {
    if (size < 0) size = response.size();
    hash.Update(response.chunk());
    received += static_cast<int64_t>(response.chunk().size());
    if (failure.ok() && std::fwrite(response.chunk().data(), 1, response.chunk().size(), out) !=
                            response.chunk().size()) {
      failure = absl::ResourceExhaustedError(
          absl::StrCat("cannot write '", temp, "': ", std::strerror(errno)));
      context.TryCancel();
    }
  }
  grpc::Status status = reader->Finish();
  const bool flushed = std::fclose(out) == 0;
  if (failure.ok() && !status.ok()) failure = FromGrpcStatus(status);
  if (failure.ok() && !flushed) failure = absl::ResourceExhaustedError("cannot flush " + temp);
  if (failure.ok() && received != size) {
    failure = absl::DataLossError(
        absl::StrCat("fetched ", received, " of the ", size, " bytes of ", digest));
  }
  if (failure.ok()) {
    const std::string actual = hash.Finish();
    if (actual != digest) {
      failure = absl::DataLossError(absl::StrCat("the fetched bytes hash to ", actual, ", not ",
                                                 digest, ": corrupted in transit"));
    }
  }
  if (failure.ok() && std::rename(temp.c_str(), path.c_str()) != 0) {
    failure = absl::InternalError(
        absl::StrCat("cannot move the fetched file to '", path, "': ", std::strerror(errno)));
  }
  if (!failure.ok()) std::remove(temp.c_str());
  return failure;
}

}  // namespace dtrain

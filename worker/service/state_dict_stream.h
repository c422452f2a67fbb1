// Worker.StreamStateDict's wire form: a job's state dict as a stream of chunks, each under
// gRPC's default message limit, so that a client with default settings (in any language) reads a
// model of any size; and the reactor that writes them.
#pragma once

#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

// Each tensor of `dict` as messages of at most kStreamChunkBytes of data, tensors in name order,
// each one's meta in its first chunk (a tensor with no data is one chunk).
std::vector<v1::StateDictChunk> StateDictChunks(const v1::StateDictResponse& dict);

// StreamStateDict's writer: the chunks are made on the executor (in turn with the job's other
// calls), then written one at a time from gRPC's callbacks. Deletes itself when done.
class StateDictWriter final : public grpc::ServerWriteReactor<v1::StateDictChunk> {
 public:
  void Start(std::vector<v1::StateDictChunk> chunks);
  void Fail(const absl::Status& status);
  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  void WriteNext();
  std::vector<v1::StateDictChunk> chunks_;
  size_t next_ = 0;
};

}  // namespace dtrain

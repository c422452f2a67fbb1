#include "worker/service/state_dict_stream.h"

#include <algorithm>
#include <string>

#include "common/grpc_status.h"
#include "common/streaming.h"

namespace dtrain {

std::vector<v1::StateDictChunk> StateDictChunks(const v1::StateDictResponse& dict) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : dict.tensors()) names.push_back(name);
  std::sort(names.begin(), names.end());
  std::vector<v1::StateDictChunk> chunks;
  for (const std::string& name : names) {
    const v1::Tensor& tensor = dict.tensors().at(name);
    const std::string& data = tensor.data();
    size_t offset = 0;
    do {
      v1::StateDictChunk chunk;
      chunk.set_name(name);
      if (offset == 0) *chunk.mutable_meta() = tensor.meta();
      const size_t take = std::min<size_t>(data.size() - offset, kStreamChunkBytes);
      chunk.set_data(data.substr(offset, take));
      offset += take;
      chunks.push_back(std::move(chunk));
    } while (offset < data.size());
  }
  return chunks;
}

void StateDictWriter::Start(std::vector<v1::StateDictChunk> chunks) {
  chunks_ = std::move(chunks);
  WriteNext();
}

void StateDictWriter::Fail(const absl::Status& status) { Finish(ToGrpcStatus(status)); }

void StateDictWriter::OnWriteDone(bool ok) {
  if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away"));
  WriteNext();
}

void StateDictWriter::WriteNext() {
  if (next_ == chunks_.size()) return Finish(grpc::Status::OK);
  StartWrite(&chunks_[next_++]);
}

}  // namespace dtrain

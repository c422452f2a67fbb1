#include "common/tensor_frames.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace dtrain {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr uint32_t kHeaderField = 1;
constexpr uint32_t kChunkField = 2;

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed stream message: ", what));
}

void AppendVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void ReleaseKeepAlive(void* user_data) {
  delete static_cast<std::shared_ptr<const void>*>(user_data);
}

void NoRelease(void*) {}

}  // namespace

absl::StatusOr<uint64_t> PayloadCursor::Advance(int64_t bytes) {
  if (bytes < 0 || static_cast<uint64_t>(bytes) > expected_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat("the stream carries ", bytes,
                                                   " more payload bytes after ", received_,
                                                   " of the ", expected_, " its header announced"));
  }
  const uint64_t at = received_;
  received_ += static_cast<uint64_t>(bytes);
  return at;
}

absl::Status ReadFrame(grpc::ByteBuffer* frame, bool header_seen,
                       google::protobuf::MessageLite* header, FrameSink* sink) {
  grpc::ProtoBufferReader reader(frame);
  google::protobuf::io::CodedInputStream input(&reader);
  bool chunk_seen = false;
  while (true) {
    const uint32_t tag = input.ReadTag();
    if (tag == 0) break;  // end of message (or a malformed tag, caught below)
    const uint32_t field = WireFormatLite::GetTagFieldNumber(tag);
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if ((field == kHeaderField || field == kChunkField) && !delimited) {
      return Malformed(absl::StrCat("field ", field, " has the wrong wire type"));
    }
    if (field == kHeaderField) {
      if (header_seen) return absl::InvalidArgumentError("the header was sent twice in one stream");
      int length = 0;
      if (!input.ReadVarintSizeAsInt(&length)) return Malformed("bad header length");
      const auto limit = input.PushLimit(length);
      if (!header->MergePartialFromCodedStream(&input) || !input.ConsumedEntireMessage()) {
        return Malformed("the header does not parse");
      }
      input.PopLimit(limit);
      header_seen = true;
      if (absl::Status s = sink->OnHeader(); !s.ok()) return s;
    } else if (field == kChunkField) {
      if (!header_seen) {
        return absl::InvalidArgumentError("the first stream message must carry the header");
      }
      if (chunk_seen) return Malformed("two chunk fields in one message");
      chunk_seen = true;
      int length = 0;
      if (!input.ReadVarintSizeAsInt(&length)) return Malformed("bad chunk length");
      absl::StatusOr<char*> room = sink->Reserve(length);
      if (!room.ok()) return room.status();
      if (length > 0 && !input.ReadRaw(*room, length)) return Malformed("truncated chunk");
    } else if (!WireFormatLite::SkipField(&input, tag)) {
      return Malformed(absl::StrCat("cannot skip unknown field ", field));
    }
  }
  if (!input.ConsumedEntireMessage() || reader.status().ok() == false) {
    return Malformed("trailing bytes or a bad tag");
  }
  if (!header_seen) {
    return absl::InvalidArgumentError("the first stream message must carry the header");
  }
  return absl::OkStatus();
}

grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite* header,
                           const std::vector<PayloadRange>& payload) {
  std::string prefix;
  if (header != nullptr) {
    const std::string encoded = header->SerializeAsString();
    prefix.push_back(static_cast<char>(
        WireFormatLite::MakeTag(kHeaderField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)));
    AppendVarint(&prefix, encoded.size());
    prefix += encoded;
  }
  size_t total = 0;
  for (const PayloadRange& r : payload) total += r.size;
  if (total > 0) {
    prefix.push_back(static_cast<char>(
        WireFormatLite::MakeTag(kChunkField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)));
    AppendVarint(&prefix, total);
  }
  std::vector<grpc::Slice> slices;
  slices.reserve(payload.size() + 1);
  slices.emplace_back(prefix);
  for (const PayloadRange& r : payload) {
    if (r.size == 0) continue;
    // gRPC never writes through a slice it sends; the cast only fits its constructor.
    char* data = const_cast<char*>(r.data);
    if (r.keep_alive) {
      slices.emplace_back(data, r.size, &ReleaseKeepAlive,
                          new std::shared_ptr<const void>(r.keep_alive));
    } else {
      slices.emplace_back(data, r.size, &NoRelease, nullptr);
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace dtrain

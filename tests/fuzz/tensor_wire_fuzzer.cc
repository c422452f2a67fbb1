// libFuzzer target: the tensor wire decoders a remote peer can reach without authenticating
// anything beyond a connection: the zero-copy stream framing (ReadFrame, as the coordinator's
// collective streams use it, with the same header validation and the payload bound both ends
// use, PayloadCursor), and the TensorProto conversion (FromProto). Any crash, sanitizer report or
// accepted-but-inconsistent tensor is a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "common/tensor.h"
#include "common/tensor_frames.h"
#include "dtrain/v1/coordinator.pb.h"

namespace {

// As the coordinator's stream reader: the header's description is validated, and the payload
// is bounded by the same PayloadCursor both ends use.
class BoundedSink : public dtrain::FrameSink {
 public:
  explicit BoundedSink(const dtrain::v1::AllReduceHeader* header) : header_(header) {}
  bool header_seen() const { return header_seen_; }
  absl::Status OnHeader() override {
    header_seen_ = true;
    absl::StatusOr<int64_t> bytes = dtrain::ValidateMeta(header_->meta(), int64_t{1} << 20);
    if (!bytes.ok()) return bytes.status();
    buffer_.resize(static_cast<size_t>(*bytes));
    payload_.Expect(static_cast<uint64_t>(*bytes));
    return absl::OkStatus();
  }
  absl::StatusOr<char*> Reserve(int64_t bytes) override {
    const uint64_t before = payload_.received();
    absl::StatusOr<uint64_t> at = payload_.Advance(bytes);
    if (!at.ok()) {
      if (payload_.received() != before) std::abort();  // a refusal takes nothing
      return at.status();
    }
    // The room handed out lies inside the announced payload, right after what came before.
    if (*at != before || payload_.received() > buffer_.size() ||
        payload_.received() - before != static_cast<uint64_t>(bytes)) {
      std::abort();
    }
    return buffer_.data() + *at;
  }

 private:
  const dtrain::v1::AllReduceHeader* header_;
  std::vector<char> buffer_;
  dtrain::PayloadCursor payload_;
  bool header_seen_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const size_t cut = size > 2 ? 1 + data[1] % (size - 1) : 1;
  data += 2;
  size -= 2;
  if (mode % 2 == 0) {
    // Several stream messages, each possibly split into two slices (gRPC hands over slices
    // wherever the transport cut them).
    dtrain::v1::AllReduceHeader header;
    BoundedSink sink(&header);
    size_t offset = 0;
    while (offset < size) {
      const size_t length =
          std::min(size - offset, static_cast<size_t>(1 + (mode / 2) * 7 + offset % 97));
      const char* at = reinterpret_cast<const char*>(data + offset);
      std::vector<grpc::Slice> slices;
      const size_t first = std::min(length, cut);
      slices.emplace_back(at, first);
      if (length > first) slices.emplace_back(at + first, length - first);
      grpc::ByteBuffer frame(slices.data(), slices.size());
      if (!dtrain::ReadFrame(&frame, sink.header_seen(), &header, &sink).ok()) break;
      offset += length;
    }
  } else {
    dtrain::v1::Tensor proto;
    if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
    absl::StatusOr<dtrain::HostTensor> tensor = dtrain::FromProto(proto);
    if (tensor.ok()) {
      // An accepted tensor must be self-consistent: its bytes are exactly what its shape and
      // dtype imply, and it survives a round trip.
      absl::Status payload = dtrain::ValidatePayload(dtrain::MetaOf(*tensor),
                                                     static_cast<int64_t>(tensor->data.size()));
      if (!payload.ok()) std::abort();
      dtrain::v1::Tensor again;
      dtrain::ToProto(*tensor, &again);
      absl::StatusOr<dtrain::HostTensor> back = dtrain::FromProto(again);
      if (!back.ok() || !(*back == *tensor)) std::abort();
    }
  }
  return 0;
}

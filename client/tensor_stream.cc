#include "client/tensor_stream.h"

#include <algorithm>
#include <exception>
#include <memory>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/streaming.h"
#include "common/tensor.h"
#include "common/tensor_frames.h"

namespace dtrain {
namespace {

// Reactor of one call. Lives on the caller's stack: Run() returns only after OnDone, after
// which gRPC touches it no more.
class TensorStreamCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                               private FrameSink {
 public:
  TensorStreamCall(const TensorStreamSpec& spec, CallCanceller* cancel)
      : cancel_(cancel, &context_),
        header_(*spec.header),
        payload_(spec.payload),
        total_(spec.payload_size),
        into_(spec.into),
        into_size_(spec.into_size) {}

  void Start(grpc::GenericStub* stub, const std::string& method, absl::Time deadline) {
    context_.set_deadline(absl::ToChronoTime(deadline));
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    WriteNext();
    StartRead(&incoming_);
    StartCall();
  }

  absl::StatusOr<TensorStreamResult> Wait() {
    done_.WaitForNotification();
    if (!parse_error_.ok()) return parse_error_;
    if (!status_.ok()) return cancel_.Explain(status_);
    if (!header_seen_) {
      return absl::InternalError("the coordinator answered OK without a result header");
    }
    if (result_payload_.received() != result_payload_.expected()) {
      return absl::InternalError(
          absl::StrCat("the coordinator's result has ", result_payload_.received(),
                       " bytes; its header says ", result_payload_.expected()));
    }
    return std::move(result_);
  }

  void OnWriteDone(bool ok) override {
    // Not ok: the server has already ended the call; OnDone brings its status.
    if (ok && offset_ < total_) WriteNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    absl::Status s = ReadFrame(&incoming_, header_seen_, &result_header_, this);
    incoming_.Clear();
    if (!s.ok()) {
      // A claim this process cannot hold parses; it is too big, and says so in its own code.
      // Everything else is INTERNAL: an INVALID_ARGUMENT here would read to the process group as
      // a call the coordinator refused, whose sequence number it did not take.
      parse_error_ = s.code() == absl::StatusCode::kResourceExhausted
                         ? s
                         : absl::InternalError(absl::StrCat(
                               "the coordinator's answer does not parse: ", s.message()));
      context_.TryCancel();
      return;
    }
    StartRead(&incoming_);
  }

  void OnDone(const grpc::Status& status) override {
    status_ = FromGrpcStatus(status);
    done_.Notify();
  }

 private:
  // The header travels with the first chunk, so a small tensor costs one message each way.
  void WriteNext() {
    const size_t take = std::min<size_t>(total_ - offset_, kStreamChunkBytes);
    std::vector<PayloadRange> ranges;
    if (take > 0) ranges.push_back(PayloadRange{payload_ + offset_, take, nullptr});
    outgoing_ = MakeFrame(offset_ == 0 ? &header_ : nullptr, ranges);
    offset_ += take;
    if (offset_ == total_) {
      StartWriteLast(&outgoing_, grpc::WriteOptions());
    } else {
      StartWrite(&outgoing_);
    }
  }

  absl::Status OnHeader() override {
    header_seen_ = true;
    size_t expected = 0;
    for (const v1::TensorMeta& meta : result_header_.parts()) {
      absl::StatusOr<int64_t> size = ValidateMeta(meta);
      if (!size.ok()) return size.status();
      if (__builtin_add_overflow(expected, static_cast<size_t>(*size), &expected)) {
        return absl::InvalidArgumentError("the result header's parts add up past 2^64 bytes");
      }
      result_.parts.push_back(meta);
    }
    result_payload_.Expect(expected);
    if (into_ != nullptr) {
      if (into_size_ != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the result has ", expected, " bytes but its destination has ", into_size_));
      }
      destination_ = into_;
    } else {
      // Room reserved, not filled: a header alone that claims gigabytes costs address space
      // (commit charge too, under vm.overcommit_memory=2), and memory only as its payload
      // arrives (Reserve grows the string inside it). A claim beyond what the process may map
      // is an error, not std::bad_alloc in a reactor.
      try {
        result_.bytes.reserve(expected);
      } catch (const std::exception&) {
        return absl::ResourceExhaustedError(absl::StrCat("this process cannot reserve the ",
                                                         expected,
                                                         " bytes the coordinator's result "
                                                         "header announces (",
                                                         result_header_.parts_size(), " parts)"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<char*> Reserve(int64_t bytes) override {
    absl::StatusOr<uint64_t> at = result_payload_.Advance(bytes);
    if (!at.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator's result: ", at.status().message()));
    }
    if (destination_ != nullptr) return destination_ + *at;
    // Inside the reserved capacity, so the bytes already written stay where they are.
    result_.bytes.resize(result_payload_.received());
    return result_.bytes.data() + *at;
  }

  grpc::ClientContext context_;
  CallCanceller::Registration cancel_;
  const google::protobuf::MessageLite& header_;
  const char* payload_;
  const size_t total_;
  size_t offset_ = 0;
  grpc::ByteBuffer outgoing_;
  grpc::ByteBuffer incoming_;
  v1::ResultHeader result_header_;
  bool header_seen_ = false;
  char* const into_;
  const size_t into_size_;
  char* destination_ = nullptr;
  PayloadCursor result_payload_;  // what the result header announced, and how much arrived
  TensorStreamResult result_;
  absl::Status parse_error_;
  absl::Status status_;
  absl::Notification done_;
};

}  // namespace

std::vector<absl::StatusOr<TensorStreamResult>> RunTensorStreams(
    grpc::GenericStub* stub, const std::vector<TensorStreamSpec>& specs, absl::Time deadline,
    CallCanceller* cancel) {
  std::vector<std::unique_ptr<TensorStreamCall>> calls;
  calls.reserve(specs.size());
  for (const TensorStreamSpec& spec : specs) {
    calls.push_back(std::make_unique<TensorStreamCall>(spec, cancel));
    calls.back()->Start(stub, spec.method, deadline);
  }
  std::vector<absl::StatusOr<TensorStreamResult>> results;
  results.reserve(calls.size());
  for (auto& call : calls) results.push_back(call->Wait());
  return results;
}

absl::StatusOr<TensorStreamResult> RunTensorStream(grpc::GenericStub* stub,
                                                   const std::string& method,
                                                   const google::protobuf::MessageLite& header,
                                                   const std::string* payload, absl::Time deadline,
                                                   std::string* into, CallCanceller* cancel) {
  TensorStreamSpec spec;
  spec.method = method;
  spec.header = &header;
  if (payload != nullptr) {
    spec.payload = payload->data();
    spec.payload_size = payload->size();
  }
  if (into != nullptr) {
    spec.into = into->data();
    spec.into_size = into->size();
  }
  return std::move(RunTensorStreams(stub, {spec}, deadline, cancel)[0]);
}

}  // namespace dtrain

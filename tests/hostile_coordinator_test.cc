// What a rank's client does with a tensor-collective answer it cannot trust (a coordinator of
// another build, or anyone on the path when TLS is off): a result header that claims more than
// the process can hold, or bytes that never come, ends the call with an error naming the claim.
// The process neither aborts (std::bad_alloc in a gRPC reactor) nor commits memory for bytes that
// were only announced. The "coordinator" here is a generic gRPC server sending crafted frames.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "client/tensor_stream.h"
#include "common/channel.h"
#include "common/tensor_frames.h"
#include "dtrain/v1/coordinator.pb.h"

namespace dtrain::testing {
namespace hostile_coordinator_test {

using ::testing::HasSubstr;

// Answers every stream with one frame holding `header` and `payload`, then OK.
class HostileCoordinator : public grpc::CallbackGenericService {
 public:
  explicit HostileCoordinator(v1::ResultHeader header, std::string payload = "")
      : header_(std::move(header)), payload_(std::move(payload)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~HostileCoordinator() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Answer : public grpc::ServerGenericBidiReactor {
     public:
      Answer(const v1::ResultHeader& header, const std::string& payload)
          : frame_(MakeFrame(&header, {PayloadRange{payload.data(), payload.size(), nullptr}})) {
        StartWrite(&frame_);
      }
      void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer frame_;
    };
    return new Answer(header_, payload_);
  }

 private:
  const v1::ResultHeader header_;
  const std::string payload_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// `parts` float32 tensors of `elements` each.
v1::ResultHeader Claiming(int parts, int64_t elements) {
  v1::ResultHeader header;
  for (int i = 0; i < parts; ++i) {
    v1::TensorMeta* meta = header.add_parts();
    meta->set_dtype(v1::DTYPE_FLOAT32);
    meta->add_shape(elements);
  }
  return header;
}

// This process's resident memory, in bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

absl::StatusOr<TensorStreamResult> Gather(const HostileCoordinator& coordinator) {
  std::shared_ptr<grpc::Channel> channel = ConnectToCoordinator(coordinator.address());
  grpc::GenericStub stub(channel);
  const v1::ResultHeader request;  // what the rank sends does not matter to this peer
  return RunTensorStream(&stub, "/dtrain.v1.Coordinator/AllGather", request, nullptr,
                         absl::Now() + absl::Seconds(30));
}

TEST(HostileCoordinator, ResultClaimingMoreThanTheProcessCanMap_IsAnErrorNotAnAbort) {
  // A sanitizer's operator new reports an impossible size and ends the process instead of
  // throwing std::bad_alloc, which is what this test needs to see (gcc names the sanitizers in
  // macros, clang before 22 only in __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers end the process on an impossible allocation";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "sanitizers end the process on an impossible allocation";
#endif
#endif
  // 32,768 parts of 8 GiB each (each within the wire format's 16 GiB bound): 256 TiB, more than
  // a 64-bit process's address space, so no overcommit setting lets the reservation through.
  HostileCoordinator coordinator(Claiming(32768, int64_t{1} << 31));
  absl::StatusOr<TensorStreamResult> result = Gather(coordinator);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("cannot reserve the 281474976710656 bytes the coordinator's result "
                        "header announces (32768 parts)"));
}

TEST(HostileCoordinator, ResultWhoseBytesNeverCome_CostsNoMemoryForTheClaim) {
  // 2 GiB announced, none sent: the claim alone must not be filled in (it was, with zeros).
  HostileCoordinator coordinator(Claiming(2, int64_t{1} << 28));
  const int64_t before = ResidentBytes();
  absl::StatusOr<TensorStreamResult> result = Gather(coordinator);
  const int64_t grew = ResidentBytes() - before;
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("the coordinator's result has 0 bytes; its header says 2147483648"));
  EXPECT_LT(grew, int64_t{256} << 20) << "resident memory grew by " << grew << " bytes";
}

TEST(HostileCoordinator, ResultCarryingMoreThanItsHeaderAnnounced_RefusedBeforeItIsWritten) {
  // 8 bytes announced (two float32), 24 sent in one chunk: not one of them may be written past
  // the 8 the rank reserved.
  HostileCoordinator coordinator(Claiming(1, 2), std::string(24, 'x'));
  absl::StatusOr<TensorStreamResult> result = Gather(coordinator);
  // INTERNAL, as every broken answer: not a refusal of the rank's own call.
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("the stream carries 24 more payload bytes after 0 of the 8 its header "
                        "announced"));
  // What was announced and sent is read whole.
  HostileCoordinator honest(Claiming(1, 2), std::string(8, 'y'));
  absl::StatusOr<TensorStreamResult> read = Gather(honest);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bytes, std::string(8, 'y'));
}

}  // namespace hostile_coordinator_test
}  // namespace dtrain::testing

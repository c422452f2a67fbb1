// Every RPC validates its input: malformed requests get INVALID_ARGUMENT or NOT_FOUND with a
// precise message, and the coordinator keeps serving the caller's group and every other group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace bad_input_test {

using ::testing::HasSubstr;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = StartCoordinator();
    ASSERT_NE(coordinator_, nullptr);
    channel_ = ConnectToCoordinator(coordinator_->address());
    stub_ = v1::Coordinator::NewStub(channel_);
    auto pg = ProcessGroup::Join(coordinator_->address(), GroupOptions("good", 1, "h"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    pg_ = std::move(*pg);
  }

  // Sends one AllReduce stream: the header (with the member of the good group unless
  // overridden) and `chunks`; returns the final status.
  absl::Status AllReduce(const v1::AllReduceHeader& header, const std::vector<std::string>& chunks,
                         bool send_header = true) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->AllReduce(&context);
    v1::AllReduceRequest request;
    if (send_header) *request.mutable_header() = header;
    if (chunks.empty()) {
      stream->Write(request);
    }
    for (const std::string& chunk : chunks) {
      request.set_chunk(chunk);
      if (!stream->Write(request)) break;
      request.Clear();
    }
    stream->WritesDone();
    v1::AllReduceResponse response;
    while (stream->Read(&response)) {
    }
    return FromGrpcStatus(stream->Finish());
  }

  v1::AllReduceHeader GoodHeader(std::vector<int64_t> shape = {4}) {
    v1::AllReduceHeader header;
    *header.mutable_context()->mutable_member() = pg_->assignment().member();
    header.mutable_context()->set_sequence(next_sequence_);
    header.set_op(v1::REDUCE_OP_SUM);
    header.mutable_meta()->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) header.mutable_meta()->add_shape(d);
    return header;
  }

  // After each bad call the good group still works and its sequence was not consumed.
  void ExpectGroupsUnharmed() {
    auto t = HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {2}, {1.5f, -2.0f});
    auto r = pg_->AllReduce(t, v1::REDUCE_OP_SUM);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->ToVector<float>(), (std::vector<float>{1.5f, -2.0f}));
    ++next_sequence_;
    auto other = RunRanks(coordinator_->address(), absl::StrCat("other-", next_sequence_), 2,
                          [](ProcessGroup& pg) { return pg.Barrier("ok"); });
    for (const auto& s : other) EXPECT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<ProcessGroup> pg_;
  int64_t next_sequence_ = 0;
};

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(text));
}

TEST_F(BadInputTest, PayloadShorterThanShape_InvalidArgument) {
  ExpectError(AllReduce(GoodHeader(), {std::string(15, 'x')}), absl::StatusCode::kInvalidArgument,
              "after 15 of the 16 payload bytes");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, PayloadLongerThanShape_InvalidArgument) {
  ExpectError(AllReduce(GoodHeader(), {std::string(12, 'x'), std::string(5, 'x')}),
              absl::StatusCode::kInvalidArgument,
              "carries 5 more payload bytes after 12 of the 16 its header announced");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, UnknownDType_InvalidArgument) {
  auto header = GoodHeader();
  header.mutable_meta()->set_dtype(static_cast<v1::DType>(99));
  ExpectError(AllReduce(header, {std::string(16, 'x')}), absl::StatusCode::kInvalidArgument,
              "unknown tensor dtype 99");
  header.mutable_meta()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectError(AllReduce(header, {}), absl::StatusCode::kInvalidArgument, "unspecified");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, NegativeDimension_InvalidArgument) {
  ExpectError(AllReduce(GoodHeader({4, -2}), {}), absl::StatusCode::kInvalidArgument,
              "negative dimension -2 at index 1");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, ElementCountOverflow_InvalidArgument) {
  ExpectError(AllReduce(GoodHeader({int64_t{1} << 40, int64_t{1} << 40}), {}),
              absl::StatusCode::kInvalidArgument, "more elements than 64 bits can count");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, MissingHeader_InvalidArgument) {
  ExpectError(AllReduce(GoodHeader(), {"abcd"}, /*send_header=*/false),
              absl::StatusCode::kInvalidArgument, "must carry the header");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, RankOutOfRange_InvalidArgument) {
  auto header = GoodHeader();
  header.mutable_context()->mutable_member()->set_rank(5);
  ExpectError(AllReduce(header, {std::string(16, 'x')}), absl::StatusCode::kInvalidArgument,
              "rank 5 is out of range for group 'good' of world size 1");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, UnknownGroup_NotFound) {
  auto header = GoodHeader();
  header.mutable_context()->mutable_member()->set_group("no-such-group");
  ExpectError(AllReduce(header, {std::string(16, 'x')}), absl::StatusCode::kNotFound,
              "no group 'no-such-group'");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, WrongIncarnation_FailedPrecondition) {
  auto header = GoodHeader();
  header.mutable_context()->mutable_member()->set_incarnation(12345);
  ExpectError(AllReduce(header, {std::string(16, 'x')}), absl::StatusCode::kFailedPrecondition,
              "not by the caller's 12345");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, UnknownReduceOp_InvalidArgument) {
  auto header = GoodHeader();
  header.set_op(static_cast<v1::ReduceOp>(17));
  ExpectError(AllReduce(header, {std::string(16, 'x')}), absl::StatusCode::kInvalidArgument,
              "unknown reduce op 17");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, SrcAndDstOutOfRange_InvalidArgument) {
  HostTensor t = HostTensor::Zeros(v1::DTYPE_INT64, {3}).value();
  ExpectError(pg_->Broadcast(1, nullptr).status(), absl::StatusCode::kInvalidArgument,
              "src rank 1 is out of range for world size 1");
  ExpectError(pg_->Reduce(t, v1::REDUCE_OP_SUM, -1).status(), absl::StatusCode::kInvalidArgument,
              "dst rank -1 is out of range");
  // The client gave the refused sequence numbers back: the group continues in step.
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, EmptyNames_InvalidArgument) {
  ExpectError(pg_->Barrier(""), absl::StatusCode::kInvalidArgument, "barrier: name is empty");
  ExpectError(pg_->store().Set("", "v"), absl::StatusCode::kInvalidArgument, "key is empty");
  KeyValueClient no_scope(channel_, "");
  ExpectError(no_scope.Set("k", "v"), absl::StatusCode::kInvalidArgument, "scope is empty");

  grpc::ClientContext context;
  v1::RegisterRequest request;
  request.set_host("h");
  request.set_world_size(1);
  request.set_local_devices(1);
  request.set_incarnation(7);
  v1::RegisterResponse response;
  ExpectError(FromGrpcStatus(stub_->Register(&context, request, &response)),
              absl::StatusCode::kInvalidArgument, "group id is empty");
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, BadRegistrations_InvalidArgument) {
  auto attempt = [&](auto mutate) {
    grpc::ClientContext context;
    v1::RegisterRequest request;
    request.set_group("g");
    request.set_host("h");
    request.set_world_size(2);
    request.set_local_devices(1);
    request.set_incarnation(7);
    mutate(request);
    v1::RegisterResponse response;
    return FromGrpcStatus(stub_->Register(&context, request, &response));
  };
  ExpectError(attempt([](auto& r) { r.set_host(""); }), absl::StatusCode::kInvalidArgument,
              "host name is empty");
  ExpectError(attempt([](auto& r) { r.set_world_size(0); }), absl::StatusCode::kInvalidArgument,
              "world_size must be in [1, 4096], got 0");
  ExpectError(attempt([](auto& r) { r.set_world_size(4097); }), absl::StatusCode::kInvalidArgument,
              "world_size must be in [1, 4096], got 4097");
  ExpectError(attempt([](auto& r) { r.set_min_world_size(3); }), absl::StatusCode::kInvalidArgument,
              "min_world_size must be in [0, world_size=2]");
  ExpectError(attempt([](auto& r) { r.set_local_devices(0); }), absl::StatusCode::kInvalidArgument,
              "local_devices must be at least 1");
  ExpectError(attempt([](auto& r) { r.set_incarnation(0); }), absl::StatusCode::kInvalidArgument,
              "incarnation must be a non-zero");
  // Register is served raw (its answers share the member list): the size bound and the parse
  // are the service's own, refused before anything is read into a group.
  ExpectError(attempt([](auto& r) { r.set_order_key(std::string(70'000, 'k')); }),
              absl::StatusCode::kInvalidArgument, "bytes; one is at most 65536");
  {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    grpc::Slice bytes(std::string("\xff\xff\xff not a message"));
    grpc::ByteBuffer garbage(&bytes, 1);
    grpc::ByteBuffer answer;
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&context, "/dtrain.v1.Coordinator/Register", grpc::StubOptions(), &garbage,
                      &answer, [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    done.WaitForNotification();
    ExpectError(FromGrpcStatus(status), absl::StatusCode::kInvalidArgument,
                "the request to /dtrain.v1.Coordinator/Register does not parse as "
                "dtrain.v1.RegisterRequest");
  }
  ExpectGroupsUnharmed();
}

TEST_F(BadInputTest, SrcWithoutPayload_InvalidArgument) {
  ExpectError(pg_->Broadcast(0, nullptr).status(), absl::StatusCode::kInvalidArgument,
              "carries no tensor");
  ExpectGroupsUnharmed();
}

// Issue 38: a header is checked against the caller's membership and call window before the
// bytes it claims are reserved. A header alone claiming 1 GiB far outside the window is refused
// at once (before, the stream waited for the payload), and so is a 16 GiB claim from a stranger.
TEST_F(BadInputTest, HugeClaimOutsideTheWindow_RefusedAtTheHeader) {
  auto header = GoodHeader({int64_t{1} << 28});
  header.mutable_context()->set_sequence(next_sequence_ + 1000);
  ExpectError(AllReduce(header, {}), absl::StatusCode::kFailedPrecondition,
              "sent collective #1000, but its next collective is #0 (at most 64 in flight)");
  auto stranger = GoodHeader({int64_t{1} << 32});
  stranger.mutable_context()->mutable_member()->set_incarnation(777);
  ExpectError(AllReduce(stranger, {}), absl::StatusCode::kFailedPrecondition,
              "not by the caller's 777");
  ExpectGroupsUnharmed();
}

// A member may hold at most 128 streams open (twice its window); the next is refused, and the
// group works again once they are gone.
TEST_F(BadInputTest, OpenStreamsPerMember_Capped) {
  struct Open {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::AllReduceRequest, v1::AllReduceResponse>> stream;
  };
  std::vector<std::unique_ptr<Open>> open;
  v1::AllReduceRequest request;
  *request.mutable_header() = GoodHeader({1 << 20});
  for (int i = 0; i < 128; ++i) {
    auto o = std::make_unique<Open>();
    o->stream = stub_->AllReduce(&o->context);
    ASSERT_TRUE(o->stream->Write(request)) << i;
    open.push_back(std::move(o));
  }
  // Each header reached the coordinator before the next check: a barrier on the same channel.
  absl::SleepFor(absl::Milliseconds(300));
  ExpectError(AllReduce(request.header(), {}), absl::StatusCode::kResourceExhausted,
              "has 128 collective streams open, its limit");
  for (auto& o : open) o->context.TryCancel();
  open.clear();
  absl::SleepFor(absl::Milliseconds(300));
  ExpectGroupsUnharmed();
}

}  // namespace bad_input_test
}  // namespace dtrain::testing

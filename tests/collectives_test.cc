// Every collective x every dtype x world sizes 1, 2, 3, 4, 8 through a real coordinator on
// 127.0.0.1, ranks as threads with their own connections, against a reference computed here.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "coordinator/collectives/reduction.h"
#include "dtrain/v1/coordinator.grpc.pb.h"
#include "tests/reference_data.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace collectives_test {

// Crosses the reducer's 1024-element blocks and is not a multiple of them.
const std::vector<int64_t> kShape = {3, 701};

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    coordinator_ = StartCoordinator();
    ASSERT_NE(coordinator_, nullptr);
  }
  std::unique_ptr<CoordinatorServer> coordinator_;
};

TEST_P(CollectivesTest, AllOpsAllDTypes_MatchReference) {
  const int world = GetParam();
  auto body = [world](ProcessGroup& pg) -> absl::Status {
    const int rank = pg.rank();
    DTRAIN_RETURN_IF_ERROR(Expect(pg.world_size() == world, "world size"));
    uint64_t seed = 0;
    for (v1::DType dtype : AllDTypes()) {
      const std::string dt = DTypeName(dtype);
      for (v1::ReduceOp op : AllReduceOps()) {
        ++seed;
        std::vector<HostTensor> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(MakeInput(dtype, kShape, r, seed));
        const std::string what = absl::StrCat(dt, " ", ReduceOpName(op), " rank ", rank);
        if (dtype == v1::DTYPE_BOOL && op == v1::REDUCE_OP_MEAN) {
          auto bad = pg.AllReduce(inputs[rank], op);
          DTRAIN_RETURN_IF_ERROR(Expect(bad.status().code() == absl::StatusCode::kInvalidArgument,
                                        "bool mean must be refused: " + bad.status().ToString()));
          continue;
        }
        const HostTensor expected = ReferenceReduce(inputs, op);
        auto all = pg.AllReduce(inputs[rank], op);
        DTRAIN_RETURN_IF_ERROR(all.status());
        DTRAIN_RETURN_IF_ERROR(Expect(*all == expected, "all_reduce " + what));
        HostTensor in_place = inputs[rank];
        DTRAIN_RETURN_IF_ERROR(pg.AllReduceInPlace(&in_place, op));
        DTRAIN_RETURN_IF_ERROR(Expect(in_place == expected, "all_reduce in place " + what));
        const int dst = static_cast<int>(seed % world);
        auto reduced = pg.Reduce(inputs[rank], op, dst);
        DTRAIN_RETURN_IF_ERROR(reduced.status());
        if (rank == dst) {
          DTRAIN_RETURN_IF_ERROR(
              Expect(reduced->has_value() && **reduced == expected, "reduce " + what));
        } else {
          DTRAIN_RETURN_IF_ERROR(Expect(!reduced->has_value(), "reduce result on non-dst " + what));
        }
      }
      ++seed;
      const HostTensor mine = MakeInput(dtype, kShape, rank, seed);
      const int src = static_cast<int>(seed % world);
      auto got = pg.Broadcast(src, rank == src ? &mine : nullptr);
      DTRAIN_RETURN_IF_ERROR(got.status());
      DTRAIN_RETURN_IF_ERROR(
          Expect(*got == MakeInput(dtype, kShape, src, seed), "broadcast " + dt));

      auto gathered = pg.AllGather(mine);
      DTRAIN_RETURN_IF_ERROR(gathered.status());
      DTRAIN_RETURN_IF_ERROR(Expect(static_cast<int>(gathered->size()) == world, "gather count"));
      for (int r = 0; r < world; ++r) {
        DTRAIN_RETURN_IF_ERROR(Expect((*gathered)[r] == MakeInput(dtype, kShape, r, seed),
                                      absl::StrCat("all_gather ", dt, " part ", r)));
      }
      auto stacked = ProcessGroup::Stack(*gathered);
      DTRAIN_RETURN_IF_ERROR(stacked.status());
      DTRAIN_RETURN_IF_ERROR(
          Expect(stacked->shape == std::vector<int64_t>{world, 3, 701}, "stack"));
    }
    DTRAIN_RETURN_IF_ERROR(pg.Barrier("end-of-ops"));
    auto all_true = pg.ReduceBooleanDecision(true, /*all=*/true);
    DTRAIN_RETURN_IF_ERROR(all_true.status());
    DTRAIN_RETURN_IF_ERROR(Expect(*all_true, "all of trues"));
    auto all_mixed = pg.ReduceBooleanDecision(rank != world - 1, /*all=*/true);
    DTRAIN_RETURN_IF_ERROR(all_mixed.status());
    DTRAIN_RETURN_IF_ERROR(Expect(!*all_mixed, "all with one false"));
    auto any_one = pg.ReduceBooleanDecision(rank == world - 1, /*all=*/false);
    DTRAIN_RETURN_IF_ERROR(any_one.status());
    DTRAIN_RETURN_IF_ERROR(Expect(*any_one, "any with one true"));
    auto any_none = pg.ReduceBooleanDecision(false, /*all=*/false);
    DTRAIN_RETURN_IF_ERROR(any_none.status());
    DTRAIN_RETURN_IF_ERROR(Expect(!*any_none, "any of falses"));
    std::string blob = absl::StrCat("opaque-bytes-from-", 0, std::string(3000, '\x7f'));
    auto bytes = pg.BroadcastBytes(0, rank == 0 ? &blob : nullptr);
    DTRAIN_RETURN_IF_ERROR(bytes.status());
    return Expect(*bytes == blob, "broadcast bytes");
  };
  const auto statuses =
      RunRanks(coordinator_->address(), absl::StrCat("all-ops-", world), world, body);
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  EXPECT_EQ(coordinator_->engine().PendingCount(), 0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return absl::StrCat("World", info.param); });

TEST(Collectives, AllGather_UnevenFirstDimension_EveryRankGetsEveryTensor) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const int world = 4;
  auto statuses = RunRanks(coordinator->address(), "uneven", world, [&](ProcessGroup& pg) {
    // Rank r sends r rows (rank 0 sends an empty tensor) of 3 int32 each.
    HostTensor mine = MakeInput(v1::DTYPE_INT32, {pg.rank(), 3}, pg.rank(), 42);
    auto parts = pg.AllGather(mine);
    if (!parts.ok()) return parts.status();
    HostTensor expected_concat;
    for (int r = 0; r < world; ++r) {
      HostTensor theirs = MakeInput(v1::DTYPE_INT32, {r, 3}, r, 42);
      if (!((*parts)[r] == theirs)) return absl::InternalError(absl::StrCat("part ", r));
      expected_concat.data += theirs.data;
    }
    auto concat = ProcessGroup::Concat(*parts);
    if (!concat.ok()) return concat.status();
    if (concat->shape != std::vector<int64_t>{0 + 1 + 2 + 3, 3} ||
        concat->data != expected_concat.data) {
      return absl::InternalError("concat");
    }
    if (ProcessGroup::Stack(*parts).ok()) return absl::InternalError("stack of uneven parts");
    // Trailing dimensions must agree: a [1, 4] tensor on rank 1 only is a mismatch.
    HostTensor odd = MakeInput(v1::DTYPE_INT32, {1, pg.rank() == 1 ? 4 : 3}, 0, 1);
    auto mismatch = pg.AllGather(odd);
    if (mismatch.status().code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError("trailing mismatch not caught: " + mismatch.status().ToString());
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
}

TEST(Collectives, SessionCalls_ThousandsBackToBack_AllSucceed) {
  // Regression: an answer can arrive before the completion of the write that asked for it;
  // the next call must not start a second write while that one is in flight.
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  std::vector<int> trues(2, 0);
  auto statuses = RunRanks(coordinator->address(), "back-to-back", 2, [&](ProcessGroup& pg) {
    for (int i = 0; i < 3000; ++i) {
      if (absl::Status s = pg.Barrier("b"); !s.ok()) return s;
      auto d = pg.ReduceBooleanDecision(i % 2 == 0, /*all=*/true);
      if (!d.ok()) return d.status();
      trues[pg.rank()] += *d;
    }
    return absl::OkStatus();
  });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(trues, (std::vector<int>{1500, 1500}));
}

TEST(Collectives, DeadlineAfterAQuietSpell_StillEnforcedInTime) {
  // With nothing waiting the coordinator's monitor ticks every 100 ms, not every tick (10 ms in
  // these tests); a collective that starts then must still fail at its deadline, within one
  // slow tick (and this machine's scheduling) of it, naming the rank that never came.
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  absl::Duration took;
  absl::Status barrier;
  auto statuses = RunRanks(coordinator->address(), "quiet", 2, [&](ProcessGroup& pg) {
    absl::SleepFor(absl::Milliseconds(500));  // several slow ticks with nothing waiting
    if (pg.rank() == 1) {
      absl::SleepFor(absl::Milliseconds(1200));  // in the group, but never at the barrier
      return absl::OkStatus();
    }
    ProcessGroup::CallOptions options;
    options.timeout = absl::Milliseconds(300);
    const absl::Time start = absl::Now();
    barrier = pg.Barrier("late", options);
    took = absl::Now() - start;
    return absl::OkStatus();
  });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(barrier.code(), absl::StatusCode::kDeadlineExceeded) << barrier;
  EXPECT_TRUE(absl::StrContains(barrier.message(), "missing")) << barrier;
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(1)) << "the deadline waited for more than a slow tick";
}

TEST(Collectives, AllReduce_SameInputsTwice_BitwiseIdenticalResults) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const int world = 3;
  std::vector<std::string> first(world), second(world);
  absl::Mutex mu;
  auto statuses = RunRanks(coordinator->address(), "repro", world, [&](ProcessGroup& pg) {
    const HostTensor in = MakeInput(v1::DTYPE_FLOAT32, {100000}, pg.rank(), 9);
    auto a = pg.AllReduce(in, v1::REDUCE_OP_SUM);
    auto b = pg.AllReduce(in, v1::REDUCE_OP_SUM);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    absl::MutexLock lock(&mu);
    first[pg.rank()] = a->data;
    second[pg.rank()] = b->data;
    return absl::OkStatus();
  });
  for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(first[r], first[0]) << "rank " << r << " differs from rank 0";
    EXPECT_EQ(second[r], first[0]) << "second run on rank " << r << " differs";
  }
}

TEST(Collectives, AllReduce_LargeTensorInSegments_MatchesReference) {
  auto coordinator = StartCoordinator();
  ASSERT_NE(coordinator, nullptr);
  const int world = 3;
  // 9 MiB + 3 elements of float64: three segments, the last one short and odd-sized.
  const std::vector<int64_t> shape = {(9 << 20) / 8 + 3};
  std::vector<HostTensor> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(MakeInput(v1::DTYPE_FLOAT64, shape, r, 77));
  const HostTensor expected = ReferenceReduce(inputs, v1::REDUCE_OP_MEAN);
  auto statuses = RunRanks(coordinator->address(), "segments", world, [&](ProcessGroup& pg) {
    HostTensor mine = inputs[pg.rank()];
    if (absl::Status s = pg.AllReduceInPlace(&mine, v1::REDUCE_OP_MEAN); !s.ok()) return s;
    if (!(mine == expected)) return absl::InternalError("segmented in-place result differs");
    auto copy = pg.AllReduce(inputs[pg.rank()], v1::REDUCE_OP_MEAN);
    if (!copy.ok()) return copy.status();
    if (!(*copy == expected)) return absl::InternalError("segmented result differs");
    // Same element count, different shapes: still a mismatch, segment by segment.
    HostTensor odd =
        HostTensor::Zeros(v1::DTYPE_FLOAT32, pg.rank() == 0 ? std::vector<int64_t>{4096, 1024}
                                                            : std::vector<int64_t>{1024, 4096})
            .value();
    absl::Status mismatch = pg.AllReduceInPlace(&odd, v1::REDUCE_OP_SUM);
    if (mismatch.code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(mismatch.message(), "float32[4096, 1024]") ||
        !absl::StrContains(mismatch.message(), "float32[1024, 4096]")) {
      return absl::InternalError("segment mismatch not reported: " + mismatch.ToString());
    }
    return pg.Barrier("after-segments");  // the group is still in step
  });
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  EXPECT_EQ(coordinator->engine().PendingCount(), 0);
}

// A client in another language with gRPC's defaults (4 MiB per received message) reads results
// over 4 MiB and over 64 MiB: every response message, header included, fits that default.
class DefaultLimitsClient {
 public:
  explicit DefaultLimitsClient(const std::string& address)
      : stub_(v1::Coordinator::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

  absl::StatusOr<v1::MemberRef> Register(const std::string& group, int world) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::RegisterRequest request;
    request.set_group(group);
    request.set_host("h");
    request.set_local_devices(1);
    request.set_incarnation(reinterpret_cast<uintptr_t>(this) | 1);
    request.set_world_size(world);
    v1::RegisterResponse response;
    grpc::Status s = stub_->Register(&context, request, &response);
    if (!s.ok()) return absl::UnknownError(s.error_message());
    rank_ = response.rank();
    return response.member();
  }

  // An all_gather (or all_reduce) of `floats` float32 values 0, 1, 2, ... scaled by `scale`;
  // the result's payload bytes and how many messages carried it.
  template <typename Request, typename Response, typename Call>
  absl::StatusOr<std::pair<std::string, int>> Stream(Call call, const v1::MemberRef& member,
                                                     int64_t sequence, int64_t floats,
                                                     float scale) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto stream = (stub_.get()->*call)(&context);
    std::vector<float> values(floats);
    for (int64_t i = 0; i < floats; ++i) values[i] = static_cast<float>(i % 1000) * scale;
    const char* bytes = reinterpret_cast<const char*>(values.data());
    const size_t total = values.size() * sizeof(float);
    constexpr size_t kChunk = 1 << 20;
    for (size_t offset = 0; offset < total; offset += kChunk) {
      Request request;
      if (offset == 0) {
        auto* header = request.mutable_header();
        *header->mutable_context()->mutable_member() = member;
        header->mutable_context()->set_sequence(sequence);
        if constexpr (std::is_same_v<Request, v1::AllReduceRequest>) {
          header->set_op(v1::REDUCE_OP_SUM);
        }
        header->mutable_meta()->set_dtype(v1::DTYPE_FLOAT32);
        header->mutable_meta()->add_shape(floats);
      }
      request.set_chunk(std::string(bytes + offset, std::min(kChunk, total - offset)));
      if (!stream->Write(request)) break;
    }
    stream->WritesDone();
    std::string result;
    int messages = 0;
    Response response;
    while (stream->Read(&response)) {
      result += response.chunk();
      ++messages;
    }
    grpc::Status s = stream->Finish();
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return std::make_pair(std::move(result), messages);
  }

  int rank() const { return rank_; }

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  int rank_ = -1;
};

TEST(Collectives, ResultsOver4And64MiB_ReadByAClientWithGrpcDefaultLimits) {
  // This client does not heartbeat; under CI load the 66 MiB gather outlasted FastOptions'
  // heartbeat timeout and the group failed. Liveness has its own tests.
  CoordinatorOptions options = FastOptions();
  options.groups.heartbeat_timeout = absl::Seconds(120);
  auto coordinator = StartCoordinator(options);
  ASSERT_NE(coordinator, nullptr);
  constexpr int kWorld = 2;
  std::vector<std::unique_ptr<DefaultLimitsClient>> clients;
  std::vector<v1::MemberRef> members(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    clients.push_back(std::make_unique<DefaultLimitsClient>(coordinator->address()));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto member = clients[r]->Register("default-limits", kWorld);
      ASSERT_TRUE(member.ok()) << member.status();
      members[r] = *member;
    });
  }
  for (std::thread& t : threads) t.join();
  threads.clear();

  // all_reduce of 5 MiB per rank, then all_gather of 33 MiB per rank (a 66 MiB result).
  const int64_t reduce_floats = (5 << 20) / 4, gather_floats = (33 << 20) / 4;
  std::vector<absl::StatusOr<std::pair<std::string, int>>> reduced(kWorld), gathered(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      reduced[r] = clients[r]->Stream<v1::AllReduceRequest, v1::AllReduceResponse>(
          &v1::Coordinator::Stub::AllReduce, members[r], 0, reduce_floats, 1.0f + r);
      gathered[r] = clients[r]->Stream<v1::AllGatherRequest, v1::AllGatherResponse>(
          &v1::Coordinator::Stub::AllGather, members[r], 1, gather_floats, 1.0f + r);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(reduced[r].ok()) << "rank " << r << ": " << reduced[r].status();
    ASSERT_TRUE(gathered[r].ok()) << "rank " << r << ": " << gathered[r].status();
    const std::string& sum = reduced[r]->first;
    ASSERT_EQ(sum.size(), static_cast<size_t>(reduce_floats) * 4);
    float value = 0;
    std::memcpy(&value, sum.data() + 4 * 999, 4);
    EXPECT_EQ(value, 999.0f * (1 + 2)) << "rank 0 sent i, rank 1 sent 2i";
    EXPECT_GE(reduced[r]->second, 2) << "5 MiB cannot travel in one default-sized message";
    const std::string& all = gathered[r]->first;
    ASSERT_EQ(all.size(), static_cast<size_t>(gather_floats) * 4 * kWorld);
    std::memcpy(&value, all.data() + static_cast<size_t>(gather_floats) * 4 + 4 * 998, 4);
    const float rank1_scale = clients[0]->rank() == 1 ? 1.0f : 2.0f;
    EXPECT_EQ(value, 998.0f * rank1_scale) << "rank 1's part follows rank 0's";
    EXPECT_GE(gathered[r]->second, 17);
  }
}

}  // namespace collectives_test
}  // namespace dtrain::testing

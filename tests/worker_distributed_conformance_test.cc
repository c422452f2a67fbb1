// Every collective backend held to the same semantics: the coordinator's gRPC collectives, Gloo
// peer to peer, shared memory between same-host ranks, and the local backend of a world of one.
// Each operation's results, on the CPU and on a device that is not; gradient averaging, with
// buckets started during backward whatever order the ranks' gradients come in, or all after it;
// reductions larger than a shared-memory slot on uneven partitions; memory from
// AllocateForAllReduce; gradients made in plane memory and reduced there.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/collectives/collective_backend.h"
#include "worker/collectives/shared_memory_collective_backend.h"
#include "worker/model/model_zoo.h"
#include "worker/strategies/gradient_landing.h"
#include "worker/strategies/gradient_landing_allocator.h"
#include "worker/strategies/gradient_sync.h"

namespace dtrain {
namespace worker_distributed_conformance_test {

// The world of one (single_device, dp) answers on the caller's device too.
TEST(LocalBackend, EveryCollectiveOnANonCpuDevice_AnswersOnThatDevice) {
  const torch::Device device = NonCpuDevice();
  LocalCollectiveBackend b;
  torch::Tensor t = torch::tensor({1.5f, -2.0f}).to(device);
  ASSERT_TRUE(b.AllReduce(t, v1::REDUCE_OP_MEAN).ok());
  ASSERT_TRUE(b.Broadcast(t, 0).ok());
  ASSERT_TRUE(b.Reduce(t, 0, v1::REDUCE_OP_SUM).ok());
  EXPECT_EQ(t.device(), device);
  EXPECT_TRUE(torch::equal(t.cpu(), torch::tensor({1.5f, -2.0f})));
  auto gathered = b.AllGather(t);
  ASSERT_TRUE(gathered.ok());
  ASSERT_EQ(gathered->size(), 1u);
  EXPECT_EQ((*gathered)[0].device(), device);
}

// What a rank's body returns when a check fails, naming the rank.
absl::Status RankFailure(int rank, const std::string& what) {
  return absl::InternalError(absl::StrCat("rank ", rank, ": ", what));
}

// The same semantics from every collective backend: the coordinator's gRPC collectives, Gloo
// peer to peer, and shared memory between same-host ranks.
class BackendConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs `body` on `world` ranks, each with this test's backend over its group.
  void RunOnBackends(const std::function<absl::Status(CollectiveBackend&)>& body, int world = 2) {
    // Results, not liveness: ranks moving hundreds of megabytes beside another such test had
    // rank 0's heartbeats held up for 2.6 s in CI (2026-12-07), past FastOptions' 2 s.
    CoordinatorOptions options = testing::FastOptions();
    options.groups.heartbeat_timeout = absl::Seconds(10);
    auto coordinator = testing::StartCoordinator(options);
    ASSERT_NE(coordinator, nullptr);
    const std::string address = coordinator->address();
    auto statuses = testing::RunRanks(
        address, "conformance-" + GetParam(), world, [&](ProcessGroup& pg) -> absl::Status {
          auto backend = MakeBackend(GetParam(), address, &pg, absl::Seconds(30));
          if (!backend.ok()) return backend.status();
          return body(**backend);
        });
    for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  }
};

TEST_P(BackendConformance, EveryCollectiveAsDocumented) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    const int r = b.rank();
    auto expect = [&](bool ok, const std::string& what) {
      return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("rank ", r, ": ", what));
    };
    EXPECT_EQ(b.name(), GetParam());
    if (auto s = b.Barrier("start"); !s.ok()) return s;
    torch::Tensor sum = torch::tensor({1.5f, -2.0f}) * (r + 1);
    if (auto s = b.AllReduce(sum, v1::REDUCE_OP_SUM); !s.ok()) return s;
    if (auto s = expect(torch::equal(sum, torch::tensor({4.5f, -6.0f})), "sum"); !s.ok()) return s;
    torch::Tensor mean = torch::tensor({3, -3}, torch::kInt64) + r;  // {3,-3} and {4,-2}
    if (auto s = b.AllReduce(mean, v1::REDUCE_OP_MEAN); !s.ok()) return s;
    // 7 / 2 and -5 / 2 round toward zero.
    if (auto s = expect(torch::equal(mean, torch::tensor({3, -2}, torch::kInt64)), "int mean");
        !s.ok())
      return s;
    torch::Tensor max = torch::tensor({static_cast<double>(r), -static_cast<double>(r)});
    if (auto s = b.AllReduce(max, v1::REDUCE_OP_MAX); !s.ok()) return s;
    if (auto s = expect(torch::equal(max, torch::tensor({1.0, 0.0})), "max"); !s.ok()) return s;
    torch::Tensor flags = torch::tensor({true, false});
    EXPECT_EQ(b.AllReduce(flags, v1::REDUCE_OP_MEAN).code(), absl::StatusCode::kInvalidArgument);
    torch::Tensor from_one = torch::full({3}, static_cast<float>(10 * r));
    if (auto s = b.Broadcast(from_one, 1); !s.ok()) return s;
    if (auto s = expect(torch::equal(from_one, torch::full({3}, 10.0f)), "broadcast"); !s.ok())
      return s;
    auto bytes = b.BroadcastBytes(r == 0 ? std::string("checkpoint\0bytes", 16) : "", 0);
    if (!bytes.ok()) return bytes.status();
    if (auto s = expect(*bytes == std::string("checkpoint\0bytes", 16), "bytes"); !s.ok()) return s;
    // Different first dimensions: rank r gives r + 1 rows.
    auto gathered = b.AllGather(torch::full({r + 1, 2}, static_cast<int32_t>(r), torch::kInt32));
    if (!gathered.ok()) return gathered.status();
    if (auto s = expect(gathered->size() == 2 && (*gathered)[0].size(0) == 1 &&
                            (*gathered)[1].size(0) == 2 && (*gathered)[1].sum().item<int>() == 4,
                        "all_gather");
        !s.ok())
      return s;
    // A rank with no rows gathers too: its part is empty and shaped like the others' rows.
    auto some = b.AllGather(torch::full({r == 0 ? 0 : 2, 2, 3}, 1.0f + r));
    if (!some.ok()) return some.status();
    if (auto s = expect(some->size() == 2 && (*some)[0].sizes() == c10::IntArrayRef({0, 2, 3}) &&
                            (*some)[1].sizes() == c10::IntArrayRef({2, 2, 3}) &&
                            (*some)[1].sum().item<float>() == 24.0f,
                        "all_gather with no rows on rank 0");
        !s.ok())
      return s;
    torch::Tensor reduced = torch::tensor({r + 1.0f});
    if (auto s = b.Reduce(reduced, 1, v1::REDUCE_OP_SUM); !s.ok()) return s;
    if (auto s = expect(reduced.item<float>() == (r == 1 ? 3.0f : 1.0f), "reduce"); !s.ok())
      return s;
    auto all = b.ReduceBooleanDecision(r == 0, /*all=*/true);
    auto any = b.ReduceBooleanDecision(r == 0, /*all=*/false);
    if (!all.ok() || !any.ok()) return all.ok() ? any.status() : all.status();
    return expect(!*all && *any, "reduce_boolean_decision");
  });
}

TEST_P(BackendConformance, EveryCollectiveOnANonCpuDevice_AnswersOnThatDevice) {
  const torch::Device device = NonCpuDevice();
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    const int r = b.rank();
    std::vector<std::string> wrong;
    auto check = [&](const torch::Tensor& got, const torch::Tensor& expected,
                     const std::string& op) {
      if (got.device() != device) {
        wrong.push_back(absl::StrCat(op, " answered on ", got.device().str()));
      } else if (!torch::equal(got.cpu(), expected)) {
        wrong.push_back(absl::StrCat(op, " computed a wrong value"));
      }
    };
    torch::Tensor sum = (torch::tensor({1.5f, -2.0f}) * (r + 1)).to(device);
    DTRAIN_RETURN_IF_ERROR(b.AllReduce(sum, v1::REDUCE_OP_SUM));
    check(sum, torch::tensor({4.5f, -6.0f}), "all_reduce sum");
    torch::Tensor mean = (torch::tensor({2.0f, 4.0f}) * (r + 1)).to(device);
    DTRAIN_RETURN_IF_ERROR(b.AllReduce(mean, v1::REDUCE_OP_MEAN));
    check(mean, torch::tensor({3.0f, 6.0f}), "all_reduce mean");
    torch::Tensor from_one = torch::full({3}, 10.0f * r).to(device);
    DTRAIN_RETURN_IF_ERROR(b.Broadcast(from_one, 1));
    check(from_one, torch::full({3}, 10.0f), "broadcast");
    DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> gathered,
                            b.AllGather(torch::full({2}, static_cast<float>(r)).to(device)));
    if (gathered.size() != 2) return absl::InternalError("all_gather: not one part per rank");
    for (int i = 0; i < 2; ++i) {
      check(gathered[i], torch::full({2}, static_cast<float>(i)), absl::StrCat("all_gather ", i));
    }
    torch::Tensor reduced = torch::tensor({r + 1.0f}).to(device);
    DTRAIN_RETURN_IF_ERROR(b.Reduce(reduced, 1, v1::REDUCE_OP_SUM));
    check(reduced, torch::tensor({r == 1 ? 3.0f : 1.0f}), "reduce");
    if (!wrong.empty()) {
      return absl::InternalError(absl::StrCat("rank ", r, ": ", absl::StrJoin(wrong, "; ")));
    }
    return absl::OkStatus();
  });
}

// DDP's gradient averaging gives the same result over either backend.
TEST_P(BackendConformance, GradientSyncAveragesAcrossRanks) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("mlp", 100 + b.rank());
    if (!model.ok()) return model.status();
    GradientSync sync(&b, model->Parameters(), /*bucket_bytes=*/256 * 1024);
    if (auto s = sync.BroadcastParameters(0); !s.ok()) return s;
    for (torch::Tensor& p : model->Parameters())
      p.mutable_grad() = torch::full_like(p, b.rank() + 1.0f);
    if (auto s = sync.AverageGradients(); !s.ok()) return s;
    for (const torch::Tensor& p : model->Parameters()) {
      if (!torch::allclose(p.grad(), torch::full_like(p, 1.5f))) {
        return absl::InternalError("gradients are not the mean over ranks");
      }
    }
    auto reference = BuiltinModel("mlp", 100);
    return torch::equal(model->Parameters()[0], reference->Parameters()[0])
               ? absl::OkStatus()
               : absl::InternalError("parameters are not rank 0's after the broadcast");
  });
}

// Overlap with backward when ranks produce gradients in different orders: rank 0's backward
// touches only bucket 0 (fc2 and fc1's bias), rank 1's only bucket 1 (fc1's weight). Rank 0
// starts bucket 0 from its hook; rank 1 may not start bucket 1 before bucket 0, so both of its
// buckets start when the round closes. The collectives still match, and a gradient that never
// came counts as zeros.
TEST_P(BackendConformance, OverlappedBucketsMatchAcrossRanksWhateverTheReadinessOrder) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("mlp", 100);
    if (!model.ok()) return model.status();
    std::vector<torch::Tensor> p = model->Parameters();  // fc1.w, fc1.b, fc2.w, fc2.b
    GradientSync sync(&b, p, /*bucket_bytes=*/256 * 1024);
    if (sync.bucket_count() != 2) return absl::InternalError("expected 2 buckets");
    sync.ExpectSync();
    torch::Tensor loss =
        b.rank() == 0 ? (2 * (p[1].sum() + p[2].sum() + p[3].sum())) : 4 * p[0].sum();
    loss.backward();
    const size_t started = sync.started_during_backward();
    if (auto s = sync.AverageGradients(); !s.ok()) return s;
    if (started != (b.rank() == 0 ? 1u : 0u)) {
      return absl::InternalError(
          absl::StrCat("rank ", b.rank(), " started ", started, " buckets during backward"));
    }
    const bool means = torch::allclose(p[0].grad(), torch::full_like(p[0], 2.0f)) &&
                       torch::allclose(p[1].grad(), torch::full_like(p[1], 1.0f)) &&
                       torch::allclose(p[2].grad(), torch::full_like(p[2], 1.0f)) &&
                       torch::allclose(p[3].grad(), torch::full_like(p[3], 1.0f));
    return means ? absl::OkStatus() : absl::InternalError("gradients are not the mean over ranks");
  });
}

// Tensors larger than one shared-memory slot (4 MiB) go in several chunks, on 3 ranks so that
// partitions are uneven; values are integers so that float sums are exact.
TEST_P(BackendConformance, LargeAllReducesAcrossChunks_ExactOnEveryRank) {
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int64_t n = 3'000'001;  // 12 MB of float32, an odd count
        const torch::Tensor index = torch::arange(n, torch::kFloat32).remainder(1000);
        const double r = b.rank();
        torch::Tensor sum = index + r;
        if (auto s = b.AllReduce(sum, v1::REDUCE_OP_SUM); !s.ok()) return s;
        torch::Tensor mean = (index * (r + 1)).to(torch::kFloat64);
        if (auto s = b.AllReduce(mean, v1::REDUCE_OP_MEAN); !s.ok()) return s;
        torch::Tensor max = index * (r - 1);  // ranks 0..2: -index, 0, index
        if (auto s = b.AllReduce(max, v1::REDUCE_OP_MAX); !s.ok()) return s;
        torch::Tensor min = index * (r - 1);
        if (auto s = b.AllReduce(min, v1::REDUCE_OP_MIN); !s.ok()) return s;
        // A non-contiguous tensor is reduced in place too.
        torch::Tensor strided = torch::full({4, 6}, static_cast<float>(r + 1)).t();
        if (auto s = b.AllReduce(strided, v1::REDUCE_OP_SUM); !s.ok()) return s;
        const bool ok = torch::equal(sum, index * 3 + 3) &&
                        torch::equal(mean, (index * 2).to(torch::kFloat64)) &&
                        torch::equal(max, index) && torch::equal(min, -index) &&
                        torch::equal(strided, torch::full({6, 4}, 6.0f));
        return ok ? absl::OkStatus()
                  : absl::InternalError(absl::StrCat("rank ", b.rank(), ": wrong reduction"));
      },
      /*world=*/3);
}

// Broadcasts, all_gathers and reduces larger than one shared-memory slot (4 MiB), on 3 ranks;
// integer and 16-bit float reductions (which shm carries itself since 2026-12-02) exact, the
// integer mean rounding toward zero and exact when the sum overflows the integer type.
TEST_P(BackendConformance, LargeBroadcastsGathersAndReducesAcrossChunks_ExactOnEveryRank) {
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int r = b.rank();
        std::vector<std::string> wrong;
        auto check = [&](bool ok, const std::string& what) {
          if (!ok) wrong.push_back(what);
        };
        const int64_t n = 3'000'001;  // 12 MB of float32, an odd count
        const torch::Tensor index = torch::arange(n, torch::kFloat32).remainder(1000);
        torch::Tensor from_two = r == 2 ? index.clone() : torch::zeros({n});
        DTRAIN_RETURN_IF_ERROR(b.Broadcast(from_two, 2));
        check(torch::equal(from_two, index), "broadcast");
        // Non-contiguous: the values land in the caller's tensor, in its layout.
        torch::Tensor strided = torch::arange(24, torch::kInt64).reshape({4, 6}).t() * (r == 0);
        DTRAIN_RETURN_IF_ERROR(b.Broadcast(strided, 0));
        check(torch::equal(strided, torch::arange(24, torch::kInt64).reshape({4, 6}).t()),
              "strided broadcast");
        std::string big(9'000'007, 'x');
        for (size_t i = 0; i < big.size(); i += 4099) big[i] = static_cast<char>('a' + i % 26);
        DTRAIN_ASSIGN_OR_RETURN(std::string bytes, b.BroadcastBytes(r == 1 ? big : "", 1));
        check(bytes == big, "broadcast_bytes");
        // Rank r gives (r + 1) * 400,003 rows of 2 floats: up to 9.6 MB, uneven.
        const int64_t rows = (r + 1) * int64_t{400'003};
        const torch::Tensor mine =
            torch::arange(rows * 2, torch::kFloat32).remainder(977).reshape({rows, 2}) + r;
        DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> parts, b.AllGather(mine));
        check(parts.size() == 3, "all_gather: one part per rank");
        for (int k = 0; k < 3 && k < static_cast<int>(parts.size()); ++k) {
          const int64_t k_rows = (k + 1) * int64_t{400'003};
          check(torch::equal(
                    parts[k],
                    torch::arange(k_rows * 2, torch::kFloat32).remainder(977).reshape({k_rows, 2}) +
                        k),
                absl::StrCat("all_gather part ", k));
        }
        DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> scalars,
                                b.AllGather(torch::tensor(r * 10, torch::kInt64)));
        check(scalars.size() == 3 && scalars[2].dim() == 0 && scalars[2].item<int64_t>() == 20,
              "all_gather of a scalar");
        torch::Tensor reduced = index * (r + 1);
        DTRAIN_RETURN_IF_ERROR(b.Reduce(reduced, 2, v1::REDUCE_OP_SUM));
        check(torch::equal(reduced, r == 2 ? index * 6 : index * (r + 1)), "reduce");
        // Integers: rank r gives (index - 500) * (r + 1); the mean of 6x over 3 ranks is 2x.
        const torch::Tensor ints = index.to(torch::kInt64) - 500;
        torch::Tensor isum = ints * (r + 1);
        DTRAIN_RETURN_IF_ERROR(b.AllReduce(isum, v1::REDUCE_OP_SUM));
        check(torch::equal(isum, ints * 6), "int64 sum");
        torch::Tensor imean = ints * (r + 1) + (r == 0);  // 6x + 1 over 3: toward zero
        DTRAIN_RETURN_IF_ERROR(b.AllReduce(imean, v1::REDUCE_OP_MEAN));
        check(torch::equal(imean, (ints * 6 + 1).div(3, "trunc")), "int64 mean");
        torch::Tensor imax = (ints * (r - 1)).to(torch::kInt32);
        DTRAIN_RETURN_IF_ERROR(b.AllReduce(imax, v1::REDUCE_OP_MAX));
        check(torch::equal(imax, ints.abs().to(torch::kInt32)), "int32 max");
        // 16-bit floats (bf16-true's gradient buckets): small integers, exact in any order. Gloo's
        // CPU all_reduce refuses them ("Invalid scalar type").
        const torch::Tensor eighths = index.remainder(8);
        for (torch::ScalarType half : {torch::kBFloat16, torch::kHalf}) {
          if (GetParam() == "gloo") break;
          torch::Tensor hsum = (eighths * (r + 1)).to(half);
          DTRAIN_RETURN_IF_ERROR(b.AllReduce(hsum, v1::REDUCE_OP_SUM));
          torch::Tensor hmean = (eighths * (r + 1)).to(half);
          DTRAIN_RETURN_IF_ERROR(b.AllReduce(hmean, v1::REDUCE_OP_MEAN));
          check(hsum.scalar_type() == half && torch::equal(hsum, (eighths * 6).to(half)) &&
                    torch::equal(hmean, (eighths * 2).to(half)),
                absl::StrCat(c10::toString(half), " sum and mean"));
        }
        // A mean whose sum overflows its type is still exact: every plane sums narrower integers
        // in int64 before it divides, as the coordinator's does.
        for (torch::ScalarType narrow : {torch::kInt32, torch::kInt8}) {
          const int64_t top = narrow == torch::kInt32 ? 2'000'000'000 : 100;
          torch::Tensor nmean = torch::full({5}, top - r, narrow);
          DTRAIN_RETURN_IF_ERROR(b.AllReduce(nmean, v1::REDUCE_OP_MEAN));
          torch::Tensor nreduced = torch::full({5}, top - r, narrow);
          DTRAIN_RETURN_IF_ERROR(b.Reduce(nreduced, 0, v1::REDUCE_OP_MEAN));
          check(nmean.scalar_type() == narrow &&
                    torch::equal(nmean, torch::full({5}, top - 1, narrow)) &&
                    torch::equal(nreduced, torch::full({5}, r == 0 ? top - 1 : top - r, narrow)),
                absl::StrCat(c10::toString(narrow), " mean over an overflowing sum"));
        }
        torch::Tensor ireduced = ints.to(torch::kInt32) * (r + 1);
        DTRAIN_RETURN_IF_ERROR(b.Reduce(ireduced, 0, v1::REDUCE_OP_MIN));
        check(torch::equal(ireduced, r == 0 ? torch::minimum(ints, ints * 3).to(torch::kInt32)
                                            : ints.to(torch::kInt32) * (r + 1)),
              "int32 reduce min");
        if (!wrong.empty()) {
          return absl::InternalError(absl::StrCat("rank ", r, ": ", absl::StrJoin(wrong, "; ")));
        }
        return absl::OkStatus();
      },
      /*world=*/3);
}

// Memory from AllocateForAllReduce reduces as ordinary memory does: the whole buffer and a
// slice at an offset, sum, mean and max, float32 and float64, and views of it as other types, on
// 3 ranks so that partitions are uneven. Random values make the float sums rounding-sensitive:
// on shm (where that memory is shared and nothing is copied) the result is bitwise the slot
// path's and the rank-order sum's.
TEST_P(BackendConformance, MemoryForAllReduce_ReducesAsOrdinaryMemory) {
  const bool shm = GetParam() == "shm";
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int64_t n = 100'003;
        const int r = b.rank();
        auto fail = [&](const std::string& what) { return RankFailure(r, what); };
        for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64}) {
          absl::StatusOr<torch::Tensor> buffer = b.AllocateForAllReduce(n, dtype);
          if (!buffer.ok()) return buffer.status();
          if (buffer->numel() != n || buffer->scalar_type() != dtype ||
              buffer->abs().max().item<double>() != 0) {
            return fail("not n zeros of the dtype asked for");
          }
          std::vector<torch::Tensor> inputs;
          for (int k = 0; k < 3; ++k) {
            // A generator of its own: the ranks are threads sharing torch's default one.
            at::Generator generator = at::detail::createCPUGenerator(7 + k);
            inputs.push_back(torch::randn({n}, generator, torch::TensorOptions().dtype(dtype)));
          }
          buffer->copy_(inputs[r]);
          torch::Tensor plain = inputs[r].clone();
          if (auto s = b.AllReduce(*buffer, v1::REDUCE_OP_MEAN); !s.ok()) return s;
          if (auto s = b.AllReduce(plain, v1::REDUCE_OP_MEAN); !s.ok()) return s;
          const torch::Tensor mean = (inputs[0] + inputs[1] + inputs[2]) / 3;
          if (shm ? !(torch::equal(*buffer, plain) && torch::equal(*buffer, mean))
                  : !torch::allclose(*buffer, mean, 1e-5, 1e-6)) {
            return fail(absl::StrCat("mean of ", c10::toString(dtype), " differs: shared vs plain ",
                                     (*buffer - plain).abs().max().item<double>(), ", vs the mean ",
                                     (*buffer - mean).abs().max().item<double>()));
          }
          // A slice at an offset (a bucket's later parameter), then a max and a sum over it.
          const torch::Tensor before = buffer->slice(0, 0, 5).clone();
          torch::Tensor slice = buffer->slice(0, 5, 5 + 777);
          slice.copy_(inputs[r].slice(0, 0, 777) * (r + 1));
          if (auto s = b.AllReduce(slice, v1::REDUCE_OP_MAX); !s.ok()) return s;
          const torch::Tensor head = inputs[0].slice(0, 0, 777);
          const torch::Tensor max = torch::maximum(
              torch::maximum(head, inputs[1].slice(0, 0, 777) * 2), inputs[2].slice(0, 0, 777) * 3);
          if (!torch::equal(slice, max)) return fail("max over a slice differs");
          if (!torch::equal(buffer->slice(0, 0, 5), before)) {
            return fail("the reduction of a slice wrote outside it");
          }
          if (auto s = b.AllReduce(*buffer, v1::REDUCE_OP_SUM); !s.ok()) return s;
          if (!torch::allclose(buffer->slice(0, 0, 5), before * 3, 1e-5, 1e-6)) {
            return fail("sum differs");
          }
        }
        // The memory viewed as another type reduces as that type: an int32 mean over an
        // overflowing sum, a bf16 sum.
        DTRAIN_ASSIGN_OR_RETURN(torch::Tensor memory, b.AllocateForAllReduce(8, torch::kFloat32));
        torch::Tensor ints = memory.view(torch::kInt32).fill_(2'000'000'000 - r);
        DTRAIN_RETURN_IF_ERROR(b.AllReduce(ints, v1::REDUCE_OP_MEAN));
        if (!torch::equal(ints, torch::full({8}, 1'999'999'999, torch::kInt32))) {
          return fail("an int32 view's mean differs");
        }
        if (GetParam() == "gloo") return absl::OkStatus();  // Gloo's CPU all_reduce refuses bf16
        torch::Tensor halves = memory.view(torch::kBFloat16);
        halves.copy_(torch::arange(16).remainder(8) * (r + 1));
        DTRAIN_RETURN_IF_ERROR(b.AllReduce(halves, v1::REDUCE_OP_SUM));
        if (!torch::equal(halves, (torch::arange(16).remainder(8) * 6).to(torch::kBFloat16))) {
          return fail("a bf16 view's sum differs");
        }
        return absl::OkStatus();
      },
      /*world=*/3);
}

// An all_reduce then a shared update (ddp's split optimizer step): every rank's mirror ends
// with every element updated from the reduced values, bitwise as one update of the whole;
// on shm each element is updated by exactly one rank (the ranges split [0, n) between the 3
// ranks), elsewhere every rank updates all of them. On shm an update that fails on one rank
// fails the call on every rank, naming it.
TEST_P(BackendConformance, AllReduceThenUpdate_EveryMirrorWhole_SplitOnShm) {
  const bool shm = GetParam() == "shm";
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int64_t n = 100'003;
        const int r = b.rank();
        auto fail = [&](const std::string& what) { return RankFailure(r, what); };
        DTRAIN_ASSIGN_OR_RETURN(torch::Tensor grads, b.AllocateForAllReduce(n, torch::kFloat32));
        DTRAIN_ASSIGN_OR_RETURN(torch::Tensor mirror, b.AllocateForAllReduce(n, torch::kFloat32));
        at::Generator generator = at::detail::createCPUGenerator(11 + r);
        grads.copy_(torch::randn({n}, generator));
        at::Generator shared = at::detail::createCPUGenerator(5);
        const torch::Tensor base = torch::randn({n}, shared);
        mirror.copy_(base);
        std::vector<int64_t> ranges;
        DTRAIN_RETURN_IF_ERROR(
            b.AllReduceThenUpdate(grads, v1::REDUCE_OP_MEAN, mirror, [&](int64_t lo, int64_t hi) {
              ranges.push_back(lo);
              ranges.push_back(hi);
              torch::Tensor part = mirror.slice(0, lo, hi);
              part.add_(grads.slice(0, lo, hi), -0.1);
              return absl::OkStatus();
            }));
        // The reduced values are the same on every rank; the update of the whole from them.
        const torch::Tensor whole = base.add(grads, -0.1);
        if (!torch::equal(mirror, whole)) {
          return fail(absl::StrCat("the mirror differs from one update of the whole by ",
                                   (mirror - whole).abs().max().item<double>()));
        }
        DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> every,
                                b.AllGather(torch::tensor(ranges, torch::kInt64)));
        std::vector<int> updates(n, 0);
        for (const torch::Tensor& row : every) {
          for (int64_t k = 0; k + 1 < row.numel(); k += 2) {
            for (int64_t i = row[k].item<int64_t>(); i < row[k + 1].item<int64_t>(); ++i) {
              ++updates[i];
            }
          }
        }
        const int want = shm ? 1 : b.world_size();
        for (int64_t i = 0; i < n; ++i) {
          if (updates[i] != want) {
            return fail(absl::StrCat("element ", i, " updated ", updates[i], " times, not ", want));
          }
        }
        if (shm && ranges.size() != 2) return fail("a shm rank updates one range");
        if (!shm) return absl::OkStatus();
        // A failed update: every rank's call fails, and the others' messages name rank 1.
        absl::Status failed =
            b.AllReduceThenUpdate(grads, v1::REDUCE_OP_MEAN, mirror, [&](int64_t, int64_t) {
              return r == 1 ? absl::InternalError("the update broke") : absl::OkStatus();
            });
        if (failed.ok()) return fail("a failed update on rank 1 passed");
        if (std::string(failed.message()).find(r == 1 ? "the update broke" : "rank 1") ==
            std::string::npos) {
          return fail(absl::StrCat("the failure does not say what broke: ", failed.message()));
        }
        return absl::OkStatus();
      },
      /*world=*/3);
}

// Without result_everywhere (ddp's split step when nothing reads the gradients after it) every
// rank's mirror is still the update of the whole, bitwise; on shm a rank's reduced tensor holds
// the mean only in the range it updated and its own input elsewhere (no rank wrote a peer's
// part), while the other planes all-reduce the whole as before.
TEST_P(BackendConformance, AllReduceThenUpdate_ResultOnlyWhereUpdated_MirrorStillWhole) {
  const bool shm = GetParam() == "shm";
  RunOnBackends(
      [&](CollectiveBackend& b) -> absl::Status {
        const int64_t n = 50'021;
        const int r = b.rank();
        auto fail = [&](const std::string& what) { return RankFailure(r, what); };
        DTRAIN_ASSIGN_OR_RETURN(torch::Tensor grads, b.AllocateForAllReduce(n, torch::kFloat32));
        DTRAIN_ASSIGN_OR_RETURN(torch::Tensor mirror, b.AllocateForAllReduce(n, torch::kFloat32));
        at::Generator generator = at::detail::createCPUGenerator(31 + r);
        const torch::Tensor mine = torch::randn({n}, generator);
        grads.copy_(mine);
        at::Generator shared = at::detail::createCPUGenerator(7);
        const torch::Tensor base = torch::randn({n}, shared);
        mirror.copy_(base);
        // Every rank's input, to know the mean without the plane.
        DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> inputs, b.AllGather(mine));
        torch::Tensor mean = inputs[0].clone();
        for (size_t k = 1; k < inputs.size(); ++k) mean.add_(inputs[k]);
        mean.div_(static_cast<double>(inputs.size()));
        int64_t lo = 0, hi = 0;
        DTRAIN_RETURN_IF_ERROR(b.AllReduceThenUpdate(
            grads, v1::REDUCE_OP_MEAN, mirror,
            [&](int64_t begin, int64_t end) {
              lo = begin;
              hi = end;
              mirror.slice(0, begin, end).add_(grads.slice(0, begin, end), -0.1);
              return absl::OkStatus();
            },
            /*source=*/{}, /*result_everywhere=*/false));
        // What each rank reduced, from the range it updated: the mirror is one update of the
        // whole from those values, bitwise, on every rank.
        DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> results, b.AllGather(grads));
        DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> ranges,
                                b.AllGather(torch::tensor({lo, hi}, torch::kInt64)));
        torch::Tensor reduced = torch::zeros({n});
        for (size_t k = 0; k < results.size(); ++k) {
          const int64_t a = ranges[k][0].item<int64_t>(), z = ranges[k][1].item<int64_t>();
          reduced.slice(0, a, z).copy_(results[k].slice(0, a, z));
        }
        if (!torch::equal(mirror, base.add(reduced, -0.1))) {
          return fail("the mirror is not one update of the whole from the reduced values");
        }
        if (!torch::allclose(reduced, mean, 1e-6, 1e-6)) return fail("the ranges hold no mean");
        if (!shm) {
          if (lo != 0 || hi != n) return fail("a plane that does not split updated a part");
          if (!torch::equal(grads, reduced)) return fail("the tensor is not all-reduced whole");
          return absl::OkStatus();
        }
        if (hi <= lo || hi - lo == n) return fail("a shm rank of 3 did not update one part");
        // Outside its range a rank's tensor is its own input, untouched by the peers.
        torch::Tensor outside = torch::ones({n}, torch::kBool);
        outside.slice(0, lo, hi).fill_(false);
        if (!torch::equal(grads.masked_select(outside), mine.masked_select(outside))) {
          return fail("a peer wrote this rank's tensor outside the range this rank updated");
        }
        return absl::OkStatus();
      },
      /*world=*/3);
}

// Gradients live in their buckets: backward accumulates into the bucket, the mean lands there,
// and no gradient tensor is replaced. A gradient outlives the GradientSync and the plane.
TEST_P(BackendConformance, GradientsLiveInTheirBuckets_AndOutliveThePlane) {
  std::vector<torch::Tensor> kept(2);
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("mlp", 100);
    if (!model.ok()) return model.status();
    std::vector<torch::Tensor> p = model->Parameters();
    auto sync = std::make_unique<GradientSync>(&b, p, /*bucket_bytes=*/256 * 1024);
    std::vector<void*> where;
    for (const torch::Tensor& t : p) {
      if (!t.grad().defined() || t.grad().abs().max().item<float>() != 0) {
        return absl::InternalError("a gradient is not set to zeros in its bucket");
      }
      where.push_back(t.grad().data_ptr());
    }
    for (int step = 0; step < 3; ++step) {
      for (const torch::Tensor& t : p) t.grad().zero_();
      sync->ExpectSync();
      // Gradient of parameter k on rank r: (r + 1) * (k + 1) * (step + 1); mean over 2 ranks:
      // 1.5 * (k + 1) * (step + 1).
      torch::Tensor loss = torch::zeros({});
      for (size_t k = 0; k < p.size(); ++k) {
        loss = loss + p[k].sum() * ((b.rank() + 1.0) * static_cast<double>(k + 1));
      }
      (loss * (step + 1)).backward();
      if (auto s = sync->AverageGradients(); !s.ok()) return s;
      for (size_t k = 0; k < p.size(); ++k) {
        if (p[k].grad().data_ptr() != where[k]) {
          return absl::InternalError(absl::StrCat("parameter ", k, "'s gradient moved"));
        }
        if (!torch::equal(p[k].grad(), torch::full_like(p[k], 1.5f * (k + 1) * (step + 1)))) {
          return absl::InternalError(
              absl::StrCat("parameter ", k, ": not the mean at step ", step));
        }
      }
    }
    sync.reset();
    kept[b.rank()] = p[0].grad();
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(kept[r].defined());
    EXPECT_TRUE(torch::equal(kept[r], torch::full_like(kept[r], 4.5f))) << "rank " << r;
  }
}

// Without overlap (ddp on the shm plane) the first bucket is not capped lower than the rest,
// and the rest keep their cap. Packed in reverse, the cnn's float32 gradients (1.7 MB) come
// first: at a 4 MiB cap they take one bucket without overlap, two with it (fc1's weight does not
// join fc2's in the first, 1 MiB); the float64 parameter listed first takes one more. At a 1 MiB
// cap without overlap fc1's weight is a bucket of its own. Nothing starts during backward even
// when a sync is expected, and each gradient stays in its bucket and gets the exact mean.
TEST_P(BackendConformance, WithoutOverlap_NoLowerFirstCap_AllReducedAfterBackward) {
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    auto model = BuiltinModel("cnn", 100);
    if (!model.ok()) return model.status();
    std::vector<torch::Tensor> p = model->Parameters();
    p.insert(p.begin(), torch::zeros({3, 5}, torch::kFloat64).requires_grad_());
    auto buckets = [&](int64_t cap, bool overlap) {
      return GradientSync(&b, p, cap, overlap).bucket_count();
    };
    const size_t overlapped = buckets(4 << 20, true), small_cap = buckets(1 << 20, false);
    if (overlapped != 3 || small_cap != 4) {
      return absl::InternalError(absl::StrCat(overlapped, " buckets with overlap (not 3), ",
                                              small_cap, " at 1 MiB without (not 4)"));
    }
    GradientSync sync(&b, p, /*bucket_bytes=*/4 << 20, /*overlap_with_backward=*/false);
    if (sync.bucket_count() != 2) {
      return absl::InternalError(absl::StrCat(sync.bucket_count(), " buckets, not 2 (2 dtypes)"));
    }
    std::vector<void*> where;
    for (const torch::Tensor& t : p) where.push_back(t.grad().data_ptr());
    for (int step = 0; step < 2; ++step) {
      for (const torch::Tensor& t : p) t.grad().zero_();
      sync.ExpectSync();
      // Parameter k's gradient on rank r: (r + 1) * (k + 1); the mean over 2 ranks: 1.5 * (k + 1).
      torch::Tensor loss = torch::zeros({}, torch::kFloat64);
      for (size_t k = 0; k < p.size(); ++k) {
        loss = loss + p[k].sum().to(torch::kFloat64) * ((b.rank() + 1.0) * (k + 1.0));
      }
      loss.backward();
      if (sync.started_during_backward() != 0) {
        return absl::InternalError(
            absl::StrCat(sync.started_during_backward(), " buckets started during backward"));
      }
      if (auto s = sync.AverageGradients(); !s.ok()) return s;
      for (size_t k = 0; k < p.size(); ++k) {
        if (p[k].grad().data_ptr() != where[k]) {
          return absl::InternalError(absl::StrCat("parameter ", k, "'s gradient moved"));
        }
        if (!torch::equal(p[k].grad(), torch::full_like(p[k], 1.5 * (k + 1.0)))) {
          return absl::InternalError(
              absl::StrCat("parameter ", k, ": not the mean at step ", step));
        }
      }
    }
    return absl::OkStatus();
  });
}

// ddp's split step with backward's gradients made in plane memory (GradientLanding): on shm
// every bucket whose gradients all landed is reduced where they lie, and the parameters and
// averaged gradients after every step are bitwise those of the same steps with every gradient
// copied into its bucket. A gradient someone keeps holds its place: it keeps its values, its
// bucket is copied again (the next gradient of that size comes from the heap) and the results
// stay the same. Elsewhere (no shared memory) nothing lands and the results are the same too.
TEST_P(BackendConformance, GradientsMadeInPlaneMemory_ReducedThere_BitwiseAsCopied) {
  const bool shm = GetParam() == "shm";
  // Before the ranks' threads allocate, as the worker's main does.
  InstallGradientLandingAllocator();
  RunOnBackends([&](CollectiveBackend& b) -> absl::Status {
    const int r = b.rank();
    auto fail = [&](const std::string& what) { return RankFailure(r, what); };
    auto model = BuiltinModel("mlp", 7);
    if (!model.ok()) return model.status();
    const std::vector<torch::Tensor> initial = model->Parameters();
    struct Run {
      std::vector<torch::Tensor> p;
      std::unique_ptr<GradientSync> sync;
    };
    // Two runs over copies of the same parameters; 512 KiB buckets: fc1's weight is one, the
    // other three parameters another.
    Run runs[2];
    for (Run& run : runs) {
      for (const torch::Tensor& t : initial) {
        run.p.push_back(t.detach().clone().requires_grad_(true));
      }
      run.sync = std::make_unique<GradientSync>(&b, run.p, /*bucket_bytes=*/512 << 10,
                                                /*overlap_with_backward=*/false);
      DTRAIN_ASSIGN_OR_RETURN(const bool shared, run.sync->PlaceParametersBesideBuckets());
      if (shared != shm || (run.sync->landing() != nullptr) != shm) {
        return fail(absl::StrCat("shared ", shared, ", landing ", run.sync->landing() != nullptr));
      }
      if (run.sync->bucket_count() != 2) return fail("not 2 buckets");
    }
    const int64_t lent_before = GradientLanding::lent_total();
    torch::Tensor held, held_values;
    for (int step = 0; step < 4; ++step) {
      for (int k = 0; k < 2; ++k) {
        Run& run = runs[k];
        for (torch::Tensor& t : run.p) t.mutable_grad().reset();  // as Lightning's zero_grad
        at::Generator data = at::detail::createCPUGenerator(100 * step + r);
        const torch::Tensor x = torch::randn({64, 784}, data);
        {
          // Run 0 lends, run 1 copies.
          GradientLanding::Scope scope(k == 0 ? run.sync->landing() : nullptr);
          torch::Tensor h = torch::relu(torch::linear(x, run.p[0], run.p[1]));
          torch::linear(h, run.p[2], run.p[3]).pow(2).mean().backward();
        }
        // Step 1 keeps rank 0's landed gradient of fc1's weight beyond its step.
        if (k == 0 && step == 1 && shm && r == 0) {
          held = run.p[0].grad();
          held_values = held.clone();
        }
        DTRAIN_RETURN_IF_ERROR(
            run.sync->AverageGradientsAndUpdate([&](size_t bucket, int64_t begin, int64_t end) {
              torch::NoGradGuard no_grad;
              run.sync->bucket_parameters(bucket)
                  .slice(0, begin, end)
                  .add_(run.sync->bucket_flat(bucket).slice(0, begin, end), -0.1);
              return absl::OkStatus();
            }));
      }
      for (size_t i = 0; i < initial.size(); ++i) {
        if (!torch::equal(runs[0].p[i], runs[1].p[i]) ||
            !torch::equal(runs[0].p[i].grad(), runs[1].p[i].grad())) {
          return fail(absl::StrCat("step ", step, ", parameter ", i, ": landed differs by ",
                                   (runs[0].p[i] - runs[1].p[i]).abs().max().item<double>()));
        }
      }
      if (torch::equal(runs[0].p[0], initial[0])) return fail("the parameters did not move");
    }
    // Landed: both buckets every step, but on rank 0 fc1's weight in the two steps after step 1
    // (its place held), while rank 1's did land: the ranks' inputs then lie in different
    // buffers. The bucket of the other three landed every step (fc2's bias, whose place is off
    // 64 bytes, copied into its place).
    const int64_t landed = runs[0].sync->landed_total(), copied = runs[1].sync->landed_total();
    if (landed != (shm ? (r == 0 ? 6 : 8) : 0) || copied != 0) {
      return fail(absl::StrCat(landed, " buckets landed (copying run: ", copied, ")"));
    }
    if (!shm) return absl::OkStatus();
    if (GradientLanding::lent_total() - lent_before < 6 + 8) {
      return fail(absl::StrCat(GradientLanding::lent_total() - lent_before, " places lent"));
    }
    // Every landed input was read in place: 4 steps x 2 buckets x 2 ranks, but rank 0's two.
    const auto* plane = dynamic_cast<const SharedMemoryCollectiveBackend*>(&b);
    if (plane == nullptr || plane->inputs_read_in_place() != 14) {
      return fail(absl::StrCat(plane == nullptr ? -1 : plane->inputs_read_in_place(),
                               " inputs read in place, not 14"));
    }
    if (r == 0) {
      if (!torch::equal(held, held_values)) return fail("a held gradient changed");
      if (reinterpret_cast<uintptr_t>(held.data_ptr()) % 64 != 0) return fail("a place off 64");
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance, ::testing::Values("grpc", "gloo", "shm"));

}  // namespace worker_distributed_conformance_test
}  // namespace dtrain

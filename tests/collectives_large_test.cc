// A 1 GiB all_reduce through a real coordinator on 127.0.0.1, ranks as threads with their own
// connections. It keeps both cores busy for 15-80 s, so it runs alone, after the other tests,
// with the load tests (label `load`): in CI beside it, other tests' ranks missed heartbeats
// for over a second and were declared dead.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace collectives_large_test {

TEST(Collectives, AllReduce_OneGiBTensor_StreamsAndIsCorrect) {
  // Production-like liveness settings: this test is about size, not about heartbeats.
  CoordinatorOptions options = FastOptions();
  options.groups.heartbeat_timeout = absl::Seconds(10);
  auto coordinator = StartCoordinator(options);
  ASSERT_NE(coordinator, nullptr);
  const int64_t elements = (int64_t{1} << 30) / 4 + 3;  // just over 1 GiB of float32
  auto statuses = RunRanks(coordinator->address(), "one-gib", 2, [&](ProcessGroup& pg) {
    HostTensor in = HostTensor::Zeros(v1::DTYPE_FLOAT32, {elements}).value();
    float* p = reinterpret_cast<float*>(in.data.data());
    for (int64_t i = 0; i < elements; ++i) p[i] = static_cast<float>((i % 1000) * (pg.rank() + 1));
    auto out = pg.AllReduce(in, v1::REDUCE_OP_SUM);
    if (!out.ok()) return out.status();
    if (out->shape != std::vector<int64_t>{elements}) return absl::InternalError("shape");
    const float* q = reinterpret_cast<const float*>(out->data.data());
    for (int64_t i = 0; i < elements; ++i) {
      if (q[i] != static_cast<float>((i % 1000) * 3)) {
        return absl::InternalError(absl::StrCat("element ", i, " is ", q[i]));
      }
    }
    return absl::OkStatus();
  });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace collectives_large_test
}  // namespace dtrain::testing

// The shm plane's fused reduction: every op and world size against the same arithmetic written
// the obvious way (rank order, the mean divided once), over lengths that end mid-block, with
// outputs that are the inputs themselves (the in-place all_reduce) and NaN propagation.
#include "worker/rank_order_reduction.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

template <typename T>
T Reference(const std::vector<std::vector<T>>& ranks, size_t i, ReductionKind kind) {
  T acc = ranks[0][i];
  for (size_t r = 1; r < ranks.size(); ++r) {
    const T v = ranks[r][i];
    if (kind == ReductionKind::kMax) {
      acc =
          std::isnan(acc) || std::isnan(v) ? std::numeric_limits<T>::quiet_NaN() : std::max(acc, v);
    } else if (kind == ReductionKind::kMin) {
      acc =
          std::isnan(acc) || std::isnan(v) ? std::numeric_limits<T>::quiet_NaN() : std::min(acc, v);
    } else {
      acc = acc + v;
    }
  }
  if (kind == ReductionKind::kMean) acc = acc / static_cast<T>(ranks.size());
  return acc;
}

template <typename T>
void CheckAll() {
  std::mt19937 gen(7);
  std::uniform_real_distribution<T> value(-3, 3);
  for (int world : {1, 2, 3, 4}) {
    for (int64_t count : {0, 1, 7, 511, 512, 513, 1500, 4096}) {
      for (ReductionKind kind :
           {ReductionKind::kSum, ReductionKind::kMean, ReductionKind::kMax, ReductionKind::kMin}) {
        std::vector<std::vector<T>> ranks(world, std::vector<T>(count));
        for (auto& rank : ranks)
          for (T& v : rank) v = value(gen);
        const std::vector<std::vector<T>> before = ranks;
        // Into a separate output and, in the same call, back into every rank's own memory.
        std::vector<T> separate(count, T(99));
        std::vector<const T*> in;
        std::vector<T*> out{separate.data()};
        for (auto& rank : ranks) {
          in.push_back(rank.data());
          out.push_back(rank.data());
        }
        ReduceInRankOrder<T>(in.data(), world, out.data(), static_cast<int>(out.size()), count,
                             kind);
        for (int64_t i = 0; i < count; ++i) {
          const T want = Reference(before, i, kind);
          ASSERT_EQ(separate[i], want) << "world " << world << " count " << count << " kind "
                                       << static_cast<int>(kind) << " element " << i;
          for (int r = 0; r < world; ++r) ASSERT_EQ(ranks[r][i], want) << "rank " << r;
        }
      }
    }
  }
}

TEST(RankOrderReduction, FloatEveryOpAndWorldMatchesRankOrderArithmeticBitwise) {
  CheckAll<float>();
}

TEST(RankOrderReduction, DoubleEveryOpAndWorldMatchesRankOrderArithmeticBitwise) {
  CheckAll<double>();
}

TEST(RankOrderReduction, MaxAndMinPropagateNaNFromEitherSide) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a{nan, 1, 2, -5}, b{0, nan, 3, -6};
  std::vector<float> out(4);
  const float* in[] = {a.data(), b.data()};
  float* outs[] = {out.data()};
  ReduceInRankOrder<float>(in, 2, outs, 1, 4, ReductionKind::kMax);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 3);
  EXPECT_EQ(out[3], -5);
  ReduceInRankOrder<float>(in, 2, outs, 1, 4, ReductionKind::kMin);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 2);
  EXPECT_EQ(out[3], -6);
}

TEST(RankOrderReduction, SumKeepsRankOrderWhereFloatAdditionDoesNotAssociate) {
  // (1e8 + -1e8) + 1 is 1 in float; 1e8 + (-1e8 + 1) is 0: the order is part of the result.
  std::vector<float> a{1e8f}, b{-1e8f}, c{1};
  std::vector<float> out(1);
  const float* in[] = {a.data(), b.data(), c.data()};
  float* outs[] = {out.data()};
  ReduceInRankOrder<float>(in, 3, outs, 1, 1, ReductionKind::kSum);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_NE(out[0], 1e8f + (-1e8f + 1.0f));
}

}  // namespace
}  // namespace dtrain

// The shm plane's fused reduction: every op and world size against the same arithmetic written
// the obvious way (rank order, the mean divided once), over lengths that end mid-block, with
// outputs that are the inputs themselves (the in-place all_reduce) and NaN propagation.
#include "worker/collectives/rank_order_reduction.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace rank_order_reduction_test {

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

// The build ReduceInRankOrder picks on this CPU (AVX2 where it has it) against the build for any
// CPU, bit for bit, on values that stress rounding: wide magnitudes, subnormals, infinities,
// NaN and signed zeros.
template <typename T>
void CompareBuilds() {
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> exponent(-40, 40), unit(-1, 1);
  std::uniform_int_distribution<int> pick(0, 40);
  const T specials[] = {std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::denorm_min(),
                        std::numeric_limits<T>::min() / 3,
                        T(0),
                        -T(0)};
  for (int world : {2, 3, 5}) {
    for (int64_t count : {int64_t{1}, int64_t{511}, int64_t{1030}, int64_t{101765}}) {
      for (ReductionKind kind :
           {ReductionKind::kSum, ReductionKind::kMean, ReductionKind::kMax, ReductionKind::kMin}) {
        std::vector<std::vector<T>> ranks(world, std::vector<T>(count));
        for (auto& rank : ranks) {
          for (T& v : rank) {
            const int p = pick(gen);
            v = p < 7 ? specials[p] : static_cast<T>(unit(gen) * std::pow(10.0, exponent(gen)));
          }
        }
        std::vector<T> best(count), generic(count);
        std::vector<const T*> in;
        for (auto& rank : ranks) in.push_back(rank.data());
        T* best_out[] = {best.data()};
        T* generic_out[] = {generic.data()};
        ReduceInRankOrder<T>(in.data(), world, best_out, 1, count, kind);
        ReduceInRankOrderGeneric<T>(in.data(), world, generic_out, 1, count, kind);
        ASSERT_EQ(std::memcmp(best.data(), generic.data(), count * sizeof(T)), 0)
            << ReductionInstructionSet() << " build, world " << world << " count " << count
            << " kind " << static_cast<int>(kind);
      }
    }
  }
}

TEST(RankOrderReduction, EveryBuildOfTheKernelGivesBitwiseTheSameResult) {
  // On an x86-64 CPU with AVX2 (every CI machine) this compares the two builds; elsewhere the
  // generic build with itself.
  CompareBuilds<float>();
  CompareBuilds<double>();
}

TEST(RankOrderReduction, RunsTheAvx2BuildWhereTheCpuHasIt) {
#if defined(__x86_64__)
  const bool has_avx2 = __builtin_cpu_supports("avx2");
  EXPECT_STREQ(ReductionInstructionSet(), has_avx2 ? "avx2" : "generic");
#else
  EXPECT_STREQ(ReductionInstructionSet(), "generic");
#endif
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

// Integers (since 2026-12-02): every op on both builds, over a length that ends mid-block; a sum
// that overflows wraps, as Gloo's does, and the mean rounds toward zero, as every plane's does.
template <typename T>
void CheckIntegers() {
  const int64_t n = 1'537;
  std::vector<T> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(i - 700);
    b[i] = static_cast<T>(3 * i - 2'000);
    c[i] = static_cast<T>((i % 7) - 3);
  }
  a[0] = std::numeric_limits<T>::max();
  b[0] = 1;
  c[0] = 0;
  const T* in[] = {a.data(), b.data(), c.data()};
  for (ReductionKind kind :
       {ReductionKind::kSum, ReductionKind::kMean, ReductionKind::kMax, ReductionKind::kMin}) {
    std::vector<T> fast(n), generic(n);
    T* fast_out[] = {fast.data()};
    T* generic_out[] = {generic.data()};
    ReduceInRankOrder<T>(in, 3, fast_out, 1, n, kind);
    ReduceInRankOrderGeneric<T>(in, 3, generic_out, 1, n, kind);
    ASSERT_EQ(fast, generic);
    for (int64_t i = 1; i < n; ++i) {
      const int64_t sum = int64_t{a[i]} + b[i] + c[i];
      const int64_t want = kind == ReductionKind::kSum    ? sum
                           : kind == ReductionKind::kMean ? sum / 3  // C++ truncates
                           : kind == ReductionKind::kMax  ? std::max({a[i], b[i], c[i]})
                                                          : std::min({a[i], b[i], c[i]});
      ASSERT_EQ(int64_t{fast[i]}, want) << "element " << i << ", kind " << static_cast<int>(kind);
    }
    if (kind == ReductionKind::kSum) {
      EXPECT_EQ(fast[0], std::numeric_limits<T>::min());
    }
  }
}

TEST(RankOrderReduction, Int32EveryOpOnBothBuilds_SumWraps_MeanTowardZero) {
  CheckIntegers<int32_t>();
}
TEST(RankOrderReduction, Int64EveryOpOnBothBuilds_SumWraps_MeanTowardZero) {
  CheckIntegers<int64_t>();
}

}  // namespace rank_order_reduction_test
}  // namespace dtrain

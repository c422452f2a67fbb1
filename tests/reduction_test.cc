// Unit tests of the coordinator's byte-level reductions: edge cases the randomized collective
// tests do not reach (NaN, wrapping, integer mean rounding, bool, refusals).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/half.h"
#include "common/tensor.h"
#include "coordinator/collectives/reduction.h"

namespace dtrain {
namespace reduction_test {

template <typename T>
std::vector<T> Reduce(v1::DType dtype, v1::ReduceOp op, const std::vector<std::vector<T>>& in) {
  std::vector<const char*> ptrs;
  for (const auto& v : in) ptrs.push_back(reinterpret_cast<const char*>(v.data()));
  std::vector<T> out(in[0].size());
  EXPECT_TRUE(ReduceBuffers(dtype, op, ptrs, static_cast<int64_t>(out.size()),
                            reinterpret_cast<char*>(out.data()))
                  .ok());
  return out;
}

TEST(Reduction, MaxMin_PropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto max = Reduce<float>(v1::DTYPE_FLOAT32, v1::REDUCE_OP_MAX, {{1, nan, 3}, {nan, 2, 1}});
  EXPECT_TRUE(std::isnan(max[0]));
  EXPECT_TRUE(std::isnan(max[1]));
  EXPECT_EQ(max[2], 3);
  auto min = Reduce<double>(v1::DTYPE_FLOAT64, v1::REDUCE_OP_MIN, {{1, 5}, {std::nan(""), 4}});
  EXPECT_TRUE(std::isnan(min[0]));
  EXPECT_EQ(min[1], 4);
}

TEST(Reduction, IntegerSumAndProduct_WrapLikeTorch) {
  EXPECT_EQ(Reduce<int8_t>(v1::DTYPE_INT8, v1::REDUCE_OP_SUM, {{100}, {100}})[0], -56);
  EXPECT_EQ(Reduce<uint8_t>(v1::DTYPE_UINT8, v1::REDUCE_OP_PRODUCT, {{16}, {17}})[0], 16);
  EXPECT_EQ(Reduce<int32_t>(v1::DTYPE_INT32, v1::REDUCE_OP_SUM,
                            {{std::numeric_limits<int32_t>::max()}, {1}})[0],
            std::numeric_limits<int32_t>::min());
}

TEST(Reduction, IntegerMean_AccumulatesWideAndRoundsTowardZero) {
  // 100 + 100 + 100 overflows int8 but not the 64-bit accumulator.
  EXPECT_EQ(Reduce<int8_t>(v1::DTYPE_INT8, v1::REDUCE_OP_MEAN, {{100}, {100}, {100}})[0], 100);
  auto mean = Reduce<int32_t>(v1::DTYPE_INT32, v1::REDUCE_OP_MEAN, {{-7, 7}, {0, 0}});
  EXPECT_EQ(mean, (std::vector<int32_t>{-3, 3}));
}

TEST(Reduction, HalfTypes_AccumulateInFloat) {
  // 2048 + 1 + 1 in float16 alone would stay 2048 (1 is below its resolution there); in float
  // the sum is 2050, exactly representable in float16.
  std::vector<uint16_t> a = {FloatToHalf(2048)}, b = {FloatToHalf(1)}, c = {FloatToHalf(1)};
  auto out = Reduce<uint16_t>(v1::DTYPE_FLOAT16, v1::REDUCE_OP_SUM, {a, b, c});
  EXPECT_EQ(HalfToFloat(out[0]), 2050.0f);
  std::vector<uint16_t> x = {FloatToBFloat16(3)}, y = {FloatToBFloat16(4)};
  EXPECT_EQ(BFloat16ToFloat(Reduce<uint16_t>(v1::DTYPE_BFLOAT16, v1::REDUCE_OP_MEAN, {x, y})[0]),
            3.5f);
}

TEST(Reduction, Bool_OrAndAnd_MeanRefused) {
  EXPECT_EQ(Reduce<uint8_t>(v1::DTYPE_BOOL, v1::REDUCE_OP_SUM, {{0, 1, 0}, {0, 0, 1}}),
            (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(Reduce<uint8_t>(v1::DTYPE_BOOL, v1::REDUCE_OP_MIN, {{1, 1, 0}, {1, 0, 1}}),
            (std::vector<uint8_t>{1, 0, 0}));
  absl::Status mean = CheckReducible(v1::DTYPE_BOOL, v1::REDUCE_OP_MEAN);
  EXPECT_EQ(mean.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckReducible(v1::DTYPE_FLOAT32, static_cast<v1::ReduceOp>(9)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace reduction_test
}  // namespace dtrain

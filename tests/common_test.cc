// Unit tests of common/: dtype facts, tensor validation, half conversions, status mapping.
#include <gtest/gtest.h>

#include <limits>

#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/half.h"
#include "common/tensor.h"

namespace dtrain {
namespace {

v1::TensorMeta Meta(v1::DType dtype, std::vector<int64_t> shape) {
  v1::TensorMeta m;
  m.set_dtype(dtype);
  for (int64_t d : shape) m.add_shape(d);
  return m;
}

TEST(DType, SizesAndNames_RoundTrip) {
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT64).value(), 8);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BFLOAT16).value(), 2);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BOOL).value(), 1);
  EXPECT_FALSE(DTypeSize(v1::DTYPE_UNSPECIFIED).ok());
  EXPECT_EQ(ParseDType("half").value(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(ParseDType(DTypeName(v1::DTYPE_INT8)).value(), v1::DTYPE_INT8);
  EXPECT_FALSE(ParseDType("complex64").ok());
}

TEST(TensorMeta, Validation_ReturnsBytesOrPreciseError) {
  EXPECT_EQ(ValidateMeta(Meta(v1::DTYPE_FLOAT32, {2, 3})).value(), 24);
  EXPECT_EQ(ValidateMeta(Meta(v1::DTYPE_INT64, {})).value(), 8);  // scalar
  EXPECT_EQ(ValidateMeta(Meta(v1::DTYPE_INT64, {0, 1 << 30})).value(), 0);
  auto negative = ValidateMeta(Meta(v1::DTYPE_FLOAT32, {2, -1}));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  auto overflow = ValidateMeta(Meta(v1::DTYPE_FLOAT64, {int64_t{1} << 31, int64_t{1} << 31}));
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  auto too_big = ValidateMeta(Meta(v1::DTYPE_UINT8, {100}), /*max_bytes=*/99);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidatePayload(Meta(v1::DTYPE_INT32, {3}), 11).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidatePayload(Meta(v1::DTYPE_INT32, {3}), 12).ok());
  EXPECT_EQ(DescribeMeta(Meta(v1::DTYPE_BFLOAT16, {4, 5})), "bfloat16[4, 5]");
}

TEST(TensorProto, RoundTrip_AndRejectsShortData) {
  HostTensor t = HostTensor::FromVector<int32_t>(v1::DTYPE_INT32, {2}, {7, -9});
  v1::Tensor proto;
  ToProto(t, &proto);
  EXPECT_EQ(FromProto(proto).value(), t);
  proto.mutable_data()->pop_back();
  EXPECT_EQ(FromProto(proto).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);  // overflow to infinity
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
  // 1 + 2^-8 lies exactly between two bfloat16 values: ties go to even (1.0).
  EXPECT_EQ(FloatToBFloat16(1.00390625f), 0x3F80);
  // 1 + 3 * 2^-8 lies between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(FloatToBFloat16(1.01171875f), 0x3F82);
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(GrpcStatus, ConversionKeepsCodeAndMessage) {
  absl::Status s = absl::DeadlineExceededError("rank 3 missing");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(g.error_message(), "rank 3 missing");
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace dtrain

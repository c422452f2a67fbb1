// common/torch_save_writer against the reader users have: files it writes, loaded by Python's
// torch.load (python3-torch) with weights_only=True, hold every dtype, shape and value as given;
// and what it cannot write is refused before anything is written.
#include "common/torch_save_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"

namespace dtrain {
namespace torch_save_writer_test {

using ::testing::HasSubstr;

template <typename T>
HostTensor Tensor(DType dtype, std::vector<int64_t> shape, std::vector<T> values) {
  return HostTensor::FromVector(dtype, std::move(shape), values);
}

TEST(TorchSaveWriter, EveryDtypeShapeAndValue_ReadBackByTorchLoad) {
  const std::string path = testing::TestTempPath("all.pt");
  auto writer = TorchSaveWriter::Create(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<std::pair<std::string, PickleValue>> items;
  auto add = [&](const std::string& name, const HostTensor& t) {
    absl::StatusOr<PickleValue> v = (*writer)->AddTensor(t);
    ASSERT_TRUE(v.ok()) << name << ": " << v.status();
    items.emplace_back(name, *std::move(v));
  };
  add("f32", Tensor<float>(v1::DTYPE_FLOAT32, {2, 3}, {1, 2, 3, 4, 5, 6.5f}));
  add("f64", Tensor<double>(v1::DTYPE_FLOAT64, {2}, {-1e300, 0.25}));
  add("f16", Tensor<uint16_t>(v1::DTYPE_FLOAT16, {2}, {0x3C00, 0xC000}));    // 1.0, -2.0
  add("bf16", Tensor<uint16_t>(v1::DTYPE_BFLOAT16, {2}, {0x3F80, 0x4040}));  // 1.0, 3.0
  add("i8", Tensor<int8_t>(v1::DTYPE_INT8, {2}, {-128, 127}));
  add("u8", Tensor<uint8_t>(v1::DTYPE_UINT8, {2}, {0, 255}));
  add("i32", Tensor<int32_t>(v1::DTYPE_INT32, {}, {-7}));  // 0-dim
  add("i64", Tensor<int64_t>(v1::DTYPE_INT64, {1, 2, 2}, {1LL << 40, -1, 0, 3}));
  add("bool", Tensor<uint8_t>(v1::DTYPE_BOOL, {3}, {1, 0, 1}));
  add("empty", Tensor<float>(v1::DTYPE_FLOAT32, {3, 0, 2}, {}));
  std::vector<PickleValue> nested;
  nested.push_back(PickleValue::Int(1LL << 40));
  nested.push_back(PickleValue::Int(-5));
  nested.push_back(PickleValue::String("naïve"));
  nested.push_back(PickleValue());  // None
  nested.push_back(PickleValue::Tuple({PickleValue::Int(2), PickleValue::List({})}));
  items.emplace_back("nested", PickleValue::List(std::move(nested)));
  items.emplace_back("no_items", PickleValue::Dict({}));
  ASSERT_TRUE((*writer)->Finish(PickleValue::Dict(std::move(items))).ok());
  EXPECT_EQ((*writer)->Finish(PickleValue()).code(), absl::StatusCode::kFailedPrecondition);

  testing::CommandResult run = testing::RunTorchPython(absl::StrCat(R"(
d = torch.load(")",
                                                                    path, R"(", weights_only=True)
assert list(d) == ["f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool", "empty",
                   "nested", "no_items"], list(d)
assert d["f32"].dtype == torch.float32 and d["f32"].tolist() == [[1, 2, 3], [4, 5, 6.5]]
assert d["f32"].stride() == (3, 1) and d["f32"].is_contiguous()
assert d["f64"].dtype == torch.float64 and d["f64"].tolist() == [-1e300, 0.25]
assert d["f16"].dtype == torch.float16 and d["f16"].tolist() == [1.0, -2.0]
assert d["bf16"].dtype == torch.bfloat16 and d["bf16"].tolist() == [1.0, 3.0]
assert d["i8"].dtype == torch.int8 and d["i8"].tolist() == [-128, 127]
assert d["u8"].dtype == torch.uint8 and d["u8"].tolist() == [0, 255]
assert d["i32"].dtype == torch.int32 and d["i32"].dim() == 0 and d["i32"].item() == -7
assert d["i64"].shape == (1, 2, 2) and d["i64"].flatten().tolist() == [1 << 40, -1, 0, 3]
assert d["bool"].dtype == torch.bool and d["bool"].tolist() == [True, False, True]
e = d["empty"]
assert e.shape == (3, 0, 2) and e.stride() == torch.empty(3, 0, 2).stride(), e.stride()
assert d["nested"] == [1 << 40, -5, "naïve", None, (2, [])], d["nested"]
assert d["no_items"] == {}
)"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST(TorchSaveWriter, AnEmptyList_IsWhatTorchLoadReturns) {
  const std::string path = testing::TestTempPath("empty.pt");
  auto writer = TorchSaveWriter::Create(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Finish(PickleValue::List({})).ok());
  testing::CommandResult run = testing::RunTorchPython(
      absl::StrCat("assert torch.load(\"", path, "\", weights_only=True) == []\n"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST(TorchSaveWriter, WhatItCannotWrite_RefusedNamingWhy) {
  auto writer = TorchSaveWriter::Create(testing::TestTempPath("bad.pt"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  HostTensor unknown;
  unknown.shape = {1};
  unknown.data = "x";
  absl::StatusOr<PickleValue> v = (*writer)->AddTensor(unknown);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("no torch storage for dtype"));
  // More elements than 64 bits count, before any allocation.
  HostTensor huge;
  huge.dtype = v1::DTYPE_FLOAT32;
  huge.shape = {1LL << 40, 1LL << 40};
  v = (*writer)->AddTensor(huge);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("more elements than 64 bits"));
  HostTensor short_data = Tensor<float>(v1::DTYPE_FLOAT32, {4}, {1, 2});
  v = (*writer)->AddTensor(short_data);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("a tensor of 16 bytes holds 8"));
  // Nested deeper than the bound.
  PickleValue deep = PickleValue::List({});
  for (int i = 0; i < 40; ++i) deep = PickleValue::List({deep});
  absl::Status finished = (*writer)->Finish(deep);
  EXPECT_EQ(finished.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(finished.message()), HasSubstr("nested deeper than 32"));
  // A directory that does not exist.
  EXPECT_EQ(TorchSaveWriter::Create("/nonexistent/dir/x.pt").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace torch_save_writer_test
}  // namespace dtrain

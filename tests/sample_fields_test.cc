// A WebDataset sample's non-image fields decoded into tensors (worker/data/sample_fields.h): each
// type from real bytes (.npy from python3-numpy's numpy.save, .pt from python3-torch's
// torch.save), and each malformed or hostile field refused with its type and reason.
#include "worker/data/sample_fields.h"

#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "worker/data/text_fields.h"

namespace dtrain {
namespace sample_fields_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int64_t> Shape(const at::Tensor& t) { return t.sizes().vec(); }

template <typename T>
std::vector<T> Values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

at::Tensor Decoded(absl::string_view bytes, FieldType type) {
  absl::StatusOr<at::Tensor> t = DecodeField(bytes, type);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return at::Tensor();
  EXPECT_TRUE(t->is_contiguous());
  return *t;
}

// The message DecodeField refuses `bytes` with; "accepted" when it does not.
std::string Refusal(absl::string_view bytes, FieldType type) {
  absl::StatusOr<at::Tensor> t = DecodeField(bytes, type);
  if (t.ok()) return "accepted";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(t.status().message());
}

TEST(FieldTypes, Names_TheSpecsTypesOnly) {
  EXPECT_EQ(*FieldTypeFromName("int"), FieldType::kInt);
  EXPECT_EQ(*FieldTypeFromName("float"), FieldType::kFloat);
  EXPECT_EQ(*FieldTypeFromName("npy"), FieldType::kNpy);
  EXPECT_EQ(*FieldTypeFromName("json"), FieldType::kJson);
  EXPECT_EQ(*FieldTypeFromName("torch"), FieldType::kTorch);
  EXPECT_EQ(*FieldTypeFromName("text"), FieldType::kText);
  EXPECT_EQ(*FieldTypeFromName("bytes"), FieldType::kBytes);
  EXPECT_EQ(*FieldTypeFromName("image"), FieldType::kImage);
  for (const char* name : {"Int", "", "cls", "images"}) {
    absl::StatusOr<FieldType> type = FieldTypeFromName(name);
    ASSERT_FALSE(type.ok()) << name;
    EXPECT_THAT(type.status().message(), HasSubstr("known: int, float, npy, json"));
  }
  for (FieldType t : {FieldType::kInt, FieldType::kFloat, FieldType::kNpy, FieldType::kJson,
                      FieldType::kTorch, FieldType::kText, FieldType::kBytes, FieldType::kImage}) {
    EXPECT_EQ(*FieldTypeFromName(FieldTypeName(t)), t);
  }
  EXPECT_STREQ(FieldTypeName(FieldType::kImage), "image");
}

TEST(FieldTypes, Extensions_AsWebDatasetDecodesThem) {
  for (const char* e : {"cls", "cls2", "index", "idx", "id", "CLS"}) {
    EXPECT_EQ(DefaultFieldType(e), FieldType::kInt) << e;
  }
  EXPECT_EQ(DefaultFieldType("npy"), FieldType::kNpy);
  EXPECT_EQ(DefaultFieldType("json"), FieldType::kJson);
  EXPECT_EQ(DefaultFieldType("pt"), FieldType::kTorch);
  EXPECT_EQ(DefaultFieldType("pth"), FieldType::kTorch);
  EXPECT_EQ(DefaultFieldType("txt"), FieldType::kText);
  EXPECT_EQ(DefaultFieldType("text"), FieldType::kText);
  for (const char* e : {"jpg", "jpeg", "png", "webp", "ppm", "pgm", "seg.png"}) {
    EXPECT_EQ(DefaultFieldType(e), FieldType::kImage) << e;
  }
  for (const char* e : {"mp3", "bin", "", "npy.gz", "cls.x"}) {
    EXPECT_EQ(DefaultFieldType(e), FieldType::kBytes) << e;
  }
}

TEST(IntField, DecimalWithSignAndSpace_Int64Scalar) {
  const std::pair<const char*, int64_t> cases[] = {
      {"7", 7},
      {"7\n", 7},
      {" \t-3 \r\n", -3},
      {"+5", 5},
      {"0042", 42},
      {"9223372036854775807", INT64_MAX},
      {"-9223372036854775808", INT64_MIN},
  };
  for (const auto& [text, value] : cases) {
    at::Tensor t = Decoded(text, FieldType::kInt);
    ASSERT_TRUE(t.defined()) << text;
    EXPECT_EQ(t.scalar_type(), at::kLong);
    EXPECT_EQ(t.dim(), 0);
    EXPECT_EQ(t.item<int64_t>(), value) << text;
  }
}

TEST(IntField, Malformed_RefusedNamingTypeAndText) {
  EXPECT_EQ(Refusal("cat", FieldType::kInt), "int field: 'cat' is not a decimal integer");
  EXPECT_EQ(Refusal("9223372036854775808", FieldType::kInt),
            "int field: '9223372036854775808' is outside int64's range");
  EXPECT_EQ(Refusal("-9223372036854775809", FieldType::kInt),
            "int field: '-9223372036854775809' is outside int64's range");
  EXPECT_EQ(Refusal(" \n", FieldType::kInt), "int field: empty, where an integer was expected");
  for (const char* text : {"1.5", "0x10", "1 2", "-", "+-1", "1e3", "\xff"}) {
    EXPECT_THAT(Refusal(text, FieldType::kInt), HasSubstr("is not a decimal integer")) << text;
  }
  EXPECT_EQ(Refusal(std::string("1\0", 2), FieldType::kInt),
            "int field: '1\\x00' is not a decimal integer");
}

// Written straight into a batch row: the same values and the same refusals as DecodeField.
TEST(ScalarFieldInto, WritesTheRowOrRefusesAsDecodeField) {
  at::Tensor labels = at::full({3}, -1, at::kLong);
  ASSERT_TRUE(DecodeScalarFieldInto(" 42\n", FieldType::kInt, labels.select(0, 1)).ok());
  EXPECT_EQ(labels[1].item<int64_t>(), 42);
  EXPECT_EQ(labels[0].item<int64_t>(), -1);
  at::Tensor values = at::zeros({2}, at::kFloat);
  ASSERT_TRUE(DecodeScalarFieldInto("0.25", FieldType::kFloat, values.select(0, 0)).ok());
  EXPECT_EQ(values[0].item<float>(), 0.25f);
  absl::Status bad = DecodeScalarFieldInto("cat", FieldType::kInt, labels.select(0, 2));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "int field: 'cat' is not a decimal integer");
  EXPECT_EQ(labels[2].item<int64_t>(), -1);
  EXPECT_EQ(DecodeScalarFieldInto("1", FieldType::kInt, values.select(0, 1)).code(),
            absl::StatusCode::kInvalidArgument);  // a float row for an int
  EXPECT_EQ(DecodeScalarFieldInto("1", FieldType::kNpy, labels.select(0, 0)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FloatField, Decimal_Float32Scalar) {
  const std::pair<const char*, float> cases[] = {
      {"0.5", 0.5f}, {" -1e3\n", -1000.0f}, {"+2", 2.0f}, {"3", 3.0f}, {"1e-50", 0.0f}};
  for (const auto& [text, value] : cases) {
    at::Tensor t = Decoded(text, FieldType::kFloat);
    ASSERT_TRUE(t.defined()) << text;
    EXPECT_EQ(t.scalar_type(), at::kFloat);
    EXPECT_EQ(t.dim(), 0);
    EXPECT_EQ(t.item<float>(), value) << text;
  }
  EXPECT_TRUE(std::isnan(Decoded("nan", FieldType::kFloat).item<float>()));
  EXPECT_EQ(Refusal("1e39", FieldType::kFloat),
            "float field: 1e+39 is beyond float32's range (largest 3.40282e+38)");
  EXPECT_THAT(Refusal("1e999", FieldType::kFloat), HasSubstr("beyond a double's range"));
  EXPECT_EQ(Refusal("one", FieldType::kFloat), "float field: 'one' is not a decimal number");
  EXPECT_THAT(Refusal("+-1", FieldType::kFloat), HasSubstr("is not a decimal number"));
  EXPECT_THAT(Refusal("0x1p3", FieldType::kFloat), HasSubstr("is not a decimal number"));
  EXPECT_THAT(Refusal("", FieldType::kFloat), HasSubstr("empty"));
}

TEST(JsonField, NumbersAndRectangularLists_Float32) {
  at::Tensor scalar = Decoded("3", FieldType::kJson);
  EXPECT_EQ(scalar.scalar_type(), at::kFloat);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item<float>(), 3.0f);
  at::Tensor matrix = Decoded(" [[1, 2.5, -3], [4e2, 0, 6]]\n", FieldType::kJson);
  EXPECT_EQ(matrix.scalar_type(), at::kFloat);
  EXPECT_THAT(Shape(matrix), ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(matrix), ElementsAre(1, 2.5, -3, 400, 0, 6));
  EXPECT_THAT(Shape(Decoded("[]", FieldType::kJson)), ElementsAre(0));
  EXPECT_THAT(Shape(Decoded("[[], []]", FieldType::kJson)), ElementsAre(2, 0));
  at::Tensor flags = Decoded("[true, false, true]", FieldType::kJson);
  EXPECT_EQ(flags.scalar_type(), at::kBool);
  EXPECT_THAT(Values<bool>(flags), ElementsAre(true, false, true));
  // The deepest nesting allowed.
  const std::string deep = std::string(kJsonMaxDepth, '[') + "1" + std::string(kJsonMaxDepth, ']');
  EXPECT_EQ(Decoded(deep, FieldType::kJson).dim(), kJsonMaxDepth);
}

TEST(JsonField, Malformed_RefusedWithTheReason) {
  EXPECT_THAT(Refusal("[[1, 2], [3]]", FieldType::kJson),
              HasSubstr("json field: JSON lists are ragged: at nesting level 2"));
  EXPECT_THAT(Refusal("[[1, 2], 3]", FieldType::kJson), HasSubstr("ragged"));
  EXPECT_THAT(Refusal("[1, [2]]", FieldType::kJson), HasSubstr("ragged"));
  EXPECT_THAT(Refusal("[1, true]", FieldType::kJson), HasSubstr("mixes numbers and booleans"));
  EXPECT_THAT(Refusal("{\"label\": 1}", FieldType::kJson),
              HasSubstr("JSON objects are not decoded"));
  EXPECT_THAT(Refusal("[\"cat\"]", FieldType::kJson),
              HasSubstr("JSON string 'cat' is not a number"));
  EXPECT_THAT(Refusal("null", FieldType::kJson), HasSubstr("JSON null is not a number"));
  EXPECT_THAT(Refusal("[1e39]", FieldType::kJson), HasSubstr("beyond float32's range"));
  EXPECT_THAT(Refusal("[1, 2", FieldType::kJson), HasSubstr("json field: not JSON"));
  EXPECT_THAT(Refusal("", FieldType::kJson), HasSubstr("json field: not JSON"));
  // Too deep and too many, refused before protobuf's parser sees them: a million '[' would
  // otherwise recurse a million frames deep.
  const std::string deeper =
      std::string(kJsonMaxDepth + 1, '[') + "1" + std::string(kJsonMaxDepth + 1, ']');
  EXPECT_THAT(Refusal(deeper, FieldType::kJson), HasSubstr("nested deeper than 32 levels"));
  EXPECT_THAT(Refusal(std::string(1 << 20, '['), FieldType::kJson),
              HasSubstr("nested deeper than 32 levels"));
  std::string many = "[0";
  for (int64_t i = 0; i < kJsonMaxElements; ++i) many += ",0";
  EXPECT_THAT(Refusal(many + "]", FieldType::kJson), HasSubstr("more than 1048576 values"));
  // Brackets and commas inside strings are not structure.
  EXPECT_THAT(Refusal("[\"[[[[,,,\\\"\"]", FieldType::kJson), HasSubstr("is not a number"));
}

TEST(TextField, Utf8_BytesAsUint8) {
  const std::string text = "h\xc3\xa9llo \xf0\x9f\x98\x80\n";  // "héllo 😀"
  at::Tensor t = Decoded(text, FieldType::kText);
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_THAT(Shape(t), ElementsAre(static_cast<int64_t>(text.size())));
  const std::vector<uint8_t> bytes = Values<uint8_t>(t);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), text);
  EXPECT_THAT(Shape(Decoded("", FieldType::kText)), ElementsAre(0));
  EXPECT_EQ(Refusal("ok\xff", FieldType::kText),
            "text field: not UTF-8: malformed sequence at byte 2 (use a bytes field for binary "
            "data)");
  EXPECT_THAT(Refusal("\xc0\xaf", FieldType::kText), HasSubstr("at byte 0"));       // overlong '/'
  EXPECT_THAT(Refusal("a\xed\xa0\x80", FieldType::kText), HasSubstr("at byte 1"));  // surrogate
  EXPECT_THAT(Refusal("\xf4\x90\x80\x80", FieldType::kText), HasSubstr("at byte 0"));  // >U+10FFFF
  EXPECT_THAT(Refusal("ab\xe2\x82", FieldType::kText), HasSubstr("at byte 2"));        // truncated
}

TEST(BytesField, AnyBytes_Uint8Copy) {
  const std::string bytes("\0\xff\x80z", 4);
  at::Tensor t = Decoded(bytes, FieldType::kBytes);
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_THAT(Values<uint8_t>(t), ElementsAre(0, 255, 128, 'z'));
  EXPECT_THAT(Refusal(std::string(kMaxFieldBytes + 1, 'x'), FieldType::kBytes),
              HasSubstr("bytes field: 67108865 bytes, over the limit of 67108864"));
}

TEST(ImageField, RefusedHere_TheImagePipelineDecodesIt) {
  EXPECT_EQ(Refusal("\xff\xd8\xff", FieldType::kImage),
            "image field: image fields are decoded by the image pipeline");
}

// Files python3-numpy and python3-torch write, made once per run.
class FromPythonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::ProcessTempDir() + "/fields");
    const std::string script = testing::ProcessTempDir() + "/make_fields.py";
    std::ofstream(script) << R"(import io, os, sys, zipfile
import numpy as np
import torch
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
def path(name): return os.path.join(d, name)
np.save(path('f32.npy'), np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5)
np.save(path('i64.npy'), np.array([-(2 ** 62), 7]))
np.save(path('f16.npy'), np.array([1.5, -2], dtype=np.float16))
np.save(path('bool.npy'), np.array([[True], [False]]))
np.save(path('u8_scalar.npy'), np.uint8(200))
np.save(path('fortran.npy'), np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)))
lying = open(path('f32.npy'), 'rb').read().replace(b'(2, 3)', b'(4, 3)')
open(path('lying.npy'), 'wb').write(lying)
torch.save(torch.arange(6, dtype=torch.float32).reshape(2, 3), path('tensor.pt'))
torch.save(torch.tensor([-1, 2 ** 40]), path('int.pt'))
torch.save(torch.arange(100.0)[10:13], path('view.pt'))
torch.save(torch.arange(6.0).reshape(2, 3).t(), path('transposed.pt'))
torch.save({'x': torch.zeros(2)}, path('dict.pt'))
torch.save([torch.zeros(2)], path('list.pt'))
torch.save(3, path('int_not_tensor.pt'))
# A tensor whose size claims more elements than its storage record holds.
b = io.BytesIO()
torch.save(torch.arange(6, dtype=torch.float32), b)
src = zipfile.ZipFile(io.BytesIO(b.getvalue()))
with zipfile.ZipFile(path('beyond_storage.pt'), 'w') as out:
    for name in src.namelist():
        data = src.read(name)
        if name.endswith('data.pkl'):
            assert b'K\x00K\x06\x85' in data
            data = data.replace(b'K\x00K\x06\x85', b'K\x04K\x06\x85')
        out.writestr(name, data)
# Stride 0 and 2**31 - 1 elements: 24 stored bytes that would show 8 GiB.
with zipfile.ZipFile(path('broadcast.pt'), 'w') as out:
    for name in src.namelist():
        data = src.read(name)
        if name.endswith('data.pkl'):
            assert b'K\x00K\x06\x85q\x06K\x01\x85' in data
            data = data.replace(b'K\x00K\x06\x85q\x06K\x01\x85',
                                b'K\x00J\xff\xff\xff\x7f\x85q\x06K\x00\x85')
        out.writestr(name, data)
)";
    testing::CommandResult run = testing::RunShell("/usr/bin/python3 " + script + " " + *dir_);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  static std::string Read(const std::string& name) {
    const std::string bytes = testing::ReadFile(*dir_ + "/" + name);
    EXPECT_FALSE(bytes.empty()) << name;
    return bytes;
  }
  static std::string* dir_;
};
std::string* FromPythonTest::dir_ = nullptr;

TEST_F(FromPythonTest, Npy_DtypeShapeAndValuesAsSaved) {
  at::Tensor f32 = Decoded(Read("f32.npy"), FieldType::kNpy);
  EXPECT_EQ(f32.scalar_type(), at::kFloat);
  EXPECT_THAT(Shape(f32), ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(f32), ElementsAre(0, 0.5, 1, 1.5, 2, 2.5));
  at::Tensor i64 = Decoded(Read("i64.npy"), FieldType::kNpy);
  EXPECT_EQ(i64.scalar_type(), at::kLong);
  EXPECT_THAT(Values<int64_t>(i64), ElementsAre(-(int64_t{1} << 62), 7));
  at::Tensor f16 = Decoded(Read("f16.npy"), FieldType::kNpy);
  EXPECT_EQ(f16.scalar_type(), at::kHalf);
  EXPECT_THAT(Values<float>(f16.to(at::kFloat)), ElementsAre(1.5, -2));
  at::Tensor flags = Decoded(Read("bool.npy"), FieldType::kNpy);
  EXPECT_EQ(flags.scalar_type(), at::kBool);
  EXPECT_THAT(Shape(flags), ElementsAre(2, 1));
  EXPECT_THAT(Values<bool>(flags), ElementsAre(true, false));
  at::Tensor u8 = Decoded(Read("u8_scalar.npy"), FieldType::kNpy);
  EXPECT_EQ(u8.scalar_type(), at::kByte);
  EXPECT_EQ(u8.dim(), 0);
  EXPECT_EQ(u8.item<uint8_t>(), 200);
}

TEST_F(FromPythonTest, NpyFortranOrder_TransposedIntoRowMajor) {
  at::Tensor t = Decoded(Read("fortran.npy"), FieldType::kNpy);
  EXPECT_EQ(t.scalar_type(), at::kInt);
  EXPECT_THAT(Shape(t), ElementsAre(2, 3));
  EXPECT_THAT(Values<int32_t>(t), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST_F(FromPythonTest, NpyLyingShape_RefusedBeforeAllocating) {
  EXPECT_EQ(Refusal(Read("lying.npy"), FieldType::kNpy),
            "npy field: not a readable .npy array: shape (4, 3) of float32 needs 48 bytes of data "
            "but the file has 24");
}

TEST_F(FromPythonTest, NpyBoolBytesOtherThanZeroOrOne_ReadAsTrue) {
  std::string file = Read("bool.npy");
  file.back() = '\x07';  // the last element, False, becomes a byte numpy never writes
  at::Tensor flags = Decoded(file, FieldType::kNpy);
  EXPECT_EQ(flags.sum().item<int64_t>(), 2);
}

TEST_F(FromPythonTest, TorchTensor_AsSaved) {
  at::Tensor t = Decoded(Read("tensor.pt"), FieldType::kTorch);
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_THAT(Shape(t), ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(t), ElementsAre(0, 1, 2, 3, 4, 5));
  at::Tensor i = Decoded(Read("int.pt"), FieldType::kTorch);
  EXPECT_EQ(i.scalar_type(), at::kLong);
  EXPECT_THAT(Values<int64_t>(i), ElementsAre(-1, int64_t{1} << 40));
}

TEST_F(FromPythonTest, TorchViews_OnlyWhatTheyShowIsKept) {
  at::Tensor view = Decoded(Read("view.pt"), FieldType::kTorch);
  EXPECT_THAT(Values<float>(view), ElementsAre(10, 11, 12));
  EXPECT_EQ(view.storage().nbytes(), 3 * sizeof(float));  // not the saved 100 elements
  at::Tensor transposed = Decoded(Read("transposed.pt"), FieldType::kTorch);
  EXPECT_THAT(Shape(transposed), ElementsAre(3, 2));
  EXPECT_THAT(Values<float>(transposed), ElementsAre(0, 3, 1, 4, 2, 5));
}

TEST_F(FromPythonTest, TorchNotOneTensor_Refused) {
  EXPECT_THAT(Refusal(Read("dict.pt"), FieldType::kTorch),
              HasSubstr("torch field: the torch.save file holds a GenericDict, not one tensor"));
  EXPECT_THAT(Refusal(Read("list.pt"), FieldType::kTorch),
              HasSubstr("holds a GenericList, not one tensor"));
  EXPECT_THAT(Refusal(Read("int_not_tensor.pt"), FieldType::kTorch),
              HasSubstr("holds a Int, not one tensor"));
  EXPECT_THAT(Refusal("not a zip", FieldType::kTorch),
              HasSubstr("torch field: 'the sample field' is not a file written by torch.save"));
  // A damaged archive: libtorch's exception comes back as a status.
  std::string damaged = Read("tensor.pt");
  damaged.resize(damaged.size() / 2);
  EXPECT_THAT(Refusal(damaged, FieldType::kTorch), HasSubstr("torch field: "));
}

TEST_F(FromPythonTest, TorchSizesBeyondStorageOrLimit_Refused) {
  EXPECT_THAT(Refusal(Read("beyond_storage.pt"), FieldType::kTorch),
              HasSubstr("reaches beyond its storage of 24 bytes"));
  EXPECT_THAT(Refusal(Read("broadcast.pt"), FieldType::kTorch),
              HasSubstr("the tensor shows 2147483647 elements, over the field limit of 67108864"));
}

// The decode pool calls DecodeField from several threads at once.
TEST_F(FromPythonTest, ManyThreadsAtOnce_EachGetsTheSameTensors) {
  const std::vector<std::pair<std::string, FieldType>> fields = {
      {Read("f32.npy"), FieldType::kNpy},     {Read("tensor.pt"), FieldType::kTorch},
      {"[[1, 2], [3, 4]]", FieldType::kJson}, {"17", FieldType::kInt},
      {"h\xc3\xa9", FieldType::kText},
  };
  std::vector<at::Tensor> expected;
  for (const auto& [bytes, type] : fields) expected.push_back(Decoded(bytes, type));
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 50; ++round) {
        for (size_t f = 0; f < fields.size(); ++f) {
          absl::StatusOr<at::Tensor> t = DecodeField(fields[f].first, fields[f].second);
          if (!t.ok() || !t->equal(expected[f])) ++mismatches[i];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

}  // namespace sample_fields_test
}  // namespace dtrain

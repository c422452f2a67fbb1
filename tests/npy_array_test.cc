// NumPy's .npy format (worker/data/npy_array.h): files written by python3-numpy's numpy.save in
// every supported dtype and format version, then headers and lengths that lie.
#include "worker/data/npy_array.h"

#include <cstring>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"

namespace dtrain {
namespace npy_array_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Files numpy writes, made once per run into a directory of this process.
class NpyFromNumpyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::ProcessTempDir() + "/npy");
    const std::string script = dir_->substr(0, dir_->size() - 4) + "/make_npy.py";
    std::ofstream(script) << R"(import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
for t in ['bool', 'uint8', 'int8', 'int16', 'int32', 'int64', 'float16', 'float32', 'float64']:
    a = (np.arange(12) % 3 == 1) if t == 'bool' else (np.arange(12) - 5).astype(t)
    np.save(os.path.join(d, t + '.npy'), a.reshape(3, 4))
    open(os.path.join(d, t + '.bin'), 'wb').write(a.tobytes())
np.save(os.path.join(d, 'scalar.npy'), np.float32(2.5))
np.save(os.path.join(d, 'empty.npy'), np.zeros((0, 3), np.float32))
np.save(os.path.join(d, 'fortran.npy'), np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)))
for v in [(1, 0), (2, 0), (3, 0)]:
    with open(os.path.join(d, 'v%d.npy' % v[0]), 'wb') as f:
        np.lib.format.write_array(f, np.arange(5, dtype=np.int16), version=v)
np.save(os.path.join(d, 'big_endian.npy'), np.arange(4, dtype='>f4'))
np.save(os.path.join(d, 'uint16.npy'), np.arange(4, dtype=np.uint16))
np.save(os.path.join(d, 'complex.npy'), np.arange(4, dtype=np.complex64))
np.save(os.path.join(d, 'unicode.npy'), np.array(['a', 'bc']))
np.save(os.path.join(d, 'object.npy'), np.array([{'a': 1}], dtype=object), allow_pickle=True)
np.save(os.path.join(d, 'structured.npy'), np.zeros(2, dtype=[('x', '<f4'), ('y', '<i4')]))
)";
    testing::CommandResult run = testing::RunShell("/usr/bin/python3 " + script + " " + *dir_);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  static std::string Read(const std::string& name) { return testing::ReadFile(*dir_ + "/" + name); }
  static std::string* dir_;
};
std::string* NpyFromNumpyTest::dir_ = nullptr;

TEST_F(NpyFromNumpyTest, EveryDtype_ShapeAndBytesAsNumpyWroteThem) {
  for (const char* dtype :
       {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}) {
    SCOPED_TRACE(dtype);
    const std::string file = Read(absl::StrCat(dtype, ".npy"));
    ASSERT_FALSE(file.empty());
    absl::StatusOr<NpyArray> array = ParseNpy(file);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->dtype, dtype);
    EXPECT_THAT(array->shape, ElementsAre(3, 4));
    EXPECT_FALSE(array->fortran_order);
    EXPECT_EQ(std::string(array->data), Read(absl::StrCat(dtype, ".bin")));
    EXPECT_EQ(array->item_bytes * 12, static_cast<int64_t>(array->data.size()));
  }
}

TEST_F(NpyFromNumpyTest, ScalarAndEmpty_ShapesNumpyGives) {
  absl::StatusOr<NpyArray> scalar = ParseNpy(Read("scalar.npy"));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_THAT(scalar->shape, IsEmpty());
  ASSERT_EQ(scalar->data.size(), 4u);
  float v = 0;
  std::memcpy(&v, scalar->data.data(), 4);
  EXPECT_EQ(v, 2.5f);
  absl::StatusOr<NpyArray> empty = ParseNpy(Read("empty.npy"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(empty->shape, ElementsAre(0, 3));
  EXPECT_TRUE(empty->data.empty());
}

TEST_F(NpyFromNumpyTest, FortranOrder_FlaggedWithColumnMajorData) {
  absl::StatusOr<NpyArray> array = ParseNpy(Read("fortran.npy"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->fortran_order);
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  int32_t v[6];
  ASSERT_EQ(array->data.size(), sizeof(v));
  std::memcpy(v, array->data.data(), sizeof(v));
  EXPECT_THAT(v, ElementsAre(0, 3, 1, 4, 2, 5));  // [[0 1 2] [3 4 5]] column by column
}

TEST_F(NpyFromNumpyTest, FormatVersions1To3_AllRead) {
  for (const char* name : {"v1.npy", "v2.npy", "v3.npy"}) {
    SCOPED_TRACE(name);
    const std::string file = Read(name);
    absl::StatusOr<NpyArray> array = ParseNpy(file);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->dtype, "int16");
    EXPECT_THAT(array->shape, ElementsAre(5));
    ASSERT_EQ(array->data.size(), 10u);
    EXPECT_EQ(array->data[2], 1);  // little-endian 1
  }
  EXPECT_EQ(Read("v2.npy")[6], 2);
  EXPECT_EQ(Read("v3.npy")[6], 3);
}

TEST_F(NpyFromNumpyTest, UnsupportedDtypes_RefusedNamingTheDtype) {
  const std::pair<const char*, const char*> cases[] = {
      {"big_endian.npy", "'>f4' is big-endian"},
      {"uint16.npy", "'<u2' is unsigned wider than a byte"},
      {"complex.npy", "'<c8' is not supported"},
      {"unicode.npy", "'<U2' is not supported"},
      {"object.npy", "'|O' holds Python objects"},
      {"structured.npy", "structured arrays are not supported"},
  };
  for (const auto& [name, message] : cases) {
    SCOPED_TRACE(name);
    absl::StatusOr<NpyArray> array = ParseNpy(Read(name));
    ASSERT_FALSE(array.ok());
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(array.status().message(), HasSubstr(message));
  }
}

TEST_F(NpyFromNumpyTest, EveryTruncation_RefusedNeverRead) {
  const std::string file = Read("float32.npy");
  for (size_t n = 0; n < file.size(); ++n) {
    absl::StatusOr<NpyArray> array = ParseNpy(absl::string_view(file).substr(0, n));
    ASSERT_FALSE(array.ok()) << n;
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // One byte too many is a lie about the shape as well.
  EXPECT_FALSE(ParseNpy(file + "x").ok());
}

// A version 1.0 file around `header` and `data`, the header's length as given.
std::string Npy(const std::string& header, const std::string& data, int major = 1) {
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const uint32_t n = static_cast<uint32_t>(header.size());
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  if (major > 1) {
    out.push_back(static_cast<char>((n >> 16) & 0xff));
    out.push_back(static_cast<char>((n >> 24) & 0xff));
  }
  return out + header + data;
}

std::string Error(const std::string& file) {
  absl::StatusOr<NpyArray> array = ParseNpy(file);
  if (array.ok()) return "accepted";
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(array.status().message());
}

TEST(NpyHeader, Accepted_WhatNumpyAndPython2Wrote) {
  absl::StatusOr<NpyArray> a =
      ParseNpy(Npy("{\"shape\": (2L, 1L), \"fortran_order\": False, \"descr\": \"<i2\"}  \n",
                   std::string(4, '\0')));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->shape, ElementsAre(2, 1));
  EXPECT_EQ(a->dtype, "int16");
  // '|' and '=' for a byte type, '=' for a wider one (the host is little-endian).
  EXPECT_EQ(Error(Npy("{'descr': '=f4', 'fortran_order': False, 'shape': (1,)}", "abcd")),
            "accepted");
  EXPECT_EQ(Error(Npy("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", "a")),
            "accepted");
}

TEST(NpyHeader, Lies_RefusedWithTheReason) {
  const std::string f4 = "'descr': '<f4', 'fortran_order': False";
  EXPECT_THAT(Error("not numpy at all"), HasSubstr("magic"));
  EXPECT_THAT(Error(Npy("{}", "", 4)), HasSubstr("format version 4.0 is unknown"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (3, 4)}", std::string(40, 'x'))),
              HasSubstr("shape (3, 4) of float32 needs 48 bytes of data but the file has 40"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (2,)}", std::string(12, 'x'))),
              HasSubstr("needs 8 bytes of data but the file has 12"));
  EXPECT_THAT(
      Error(Npy("{" + f4 + ", 'shape': (2147483648, 2147483648, 2147483648, 2147483648)}", "")),
      HasSubstr("more elements than can be addressed"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (2147483649,)}", "")),
              HasSubstr("exceeds 2147483648"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (99999999999999999999999999,)}", "")),
              HasSubstr("exceeds 2147483648"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}", "abcd")),
              HasSubstr("more than 8 dimensions"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (-1,)}", "")),
              HasSubstr("other than non-negative integers"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (1)}", "abcd")),
              HasSubstr("not a tuple (numpy writes (n,))"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': [1]}", "abcd")),
              HasSubstr("'shape' is not a tuple"));
  EXPECT_THAT(Error(Npy("{'descr': '<f4', 'shape': (1,)}", "abcd")),
              HasSubstr("lacks one of 'descr', 'fortran_order' and 'shape'"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (1,), 'shape': (1,)}", "abcd")),
              HasSubstr("'shape' appears twice"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (1,), '__class__': 1}", "abcd")),
              HasSubstr("unexpected key '__class__'"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (1,)} __import__('os')", "abcd")),
              HasSubstr("text after the header's closing '}'"));
  EXPECT_THAT(Error(Npy("{'descr': '<f4', 'fortran_order': 1, 'shape': (1,)}", "abcd")),
              HasSubstr("neither True nor False"));
  EXPECT_THAT(Error(Npy("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", "abcd")),
              HasSubstr("unexpected character in a string"));
  EXPECT_THAT(Error(Npy("{'descr': '|f4', 'fortran_order': False, 'shape': (1,)}", "abcd")),
              HasSubstr("'|f4' is not supported"));
  EXPECT_THAT(Error(Npy("{" + f4 + ", 'shape': (1,)", "abcd")), HasSubstr("expected ',' or '}'"));
  // A length beyond the file, and one over the limit, are refused before anything is read.
  std::string beyond = Npy("{}", "");
  beyond[8] = '\xff';
  EXPECT_THAT(Error(beyond), HasSubstr("the header claims 255 bytes but only 2 follow"));
  std::string huge = Npy("{}", "", 2);
  huge[10] = '\x01';  // 65536 + 2
  EXPECT_THAT(Error(huge), HasSubstr("over the limit of 65536"));
}

}  // namespace npy_array_test
}  // namespace dtrain

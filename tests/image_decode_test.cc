// DecodeImage against PIL: tests/python/torchvision_reference.py encodes images with PIL (libjpeg,
// libpng, libwebp underneath) and writes PIL's convert("RGB") and convert("L") pixels; each
// decode here must equal them byte for byte. Then the failures: damaged, truncated, oversized and
// unknown inputs each get INVALID_ARGUMENT naming the format and the reason.
#include "worker/data/image_decode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"

namespace dtrain {
namespace image_decode_test {

using ::dtrain::testing::CommandResult;
using ::dtrain::testing::ProcessTempDir;
using ::dtrain::testing::ReadFile;
using ::dtrain::testing::RunShell;
using ::testing::HasSubstr;

struct Reference {
  int width = 0;
  int height = 0;
};

class ImageDecodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(ProcessTempDir() + "/decode-reference");
    CommandResult made = RunShell(absl::StrCat("/usr/bin/python3 " DTRAIN_SOURCE_DIR
                                               "/tests/python/torchvision_reference.py decode ",
                                               *dir_, " 2>&1"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    references_ = new std::map<std::string, Reference>();
    std::ifstream manifest(*dir_ + "/manifest.txt");
    std::string name;
    Reference ref;
    while (manifest >> name >> ref.width >> ref.height) (*references_)[name] = ref;
  }
  static std::string File(const std::string& name) { return ReadFile(*dir_ + "/" + name); }

  static std::string* dir_;
  static std::map<std::string, Reference>* references_;
};
std::string* ImageDecodeTest::dir_ = nullptr;
std::map<std::string, Reference>* ImageDecodeTest::references_ = nullptr;

std::string Bytes(const DecodedImage& image) {
  return std::string(image.pixels.begin(), image.pixels.end());
}

TEST_F(ImageDecodeTest, EveryFormat_EqualsPilConvertRgbAndL) {
  ASSERT_EQ(references_->size(), 11u);
  for (const auto& [name, ref] : *references_) {
    SCOPED_TRACE(name);
    const std::string bytes = File(name);
    ASSERT_FALSE(bytes.empty());
    absl::StatusOr<ImageHeader> header = ReadImageHeader(bytes);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->width, ref.width);
    EXPECT_EQ(header->height, ref.height);

    absl::StatusOr<DecodedImage> rgb = DecodeImage(bytes, {});
    ASSERT_TRUE(rgb.ok()) << rgb.status();
    EXPECT_EQ(rgb->width, ref.width);
    EXPECT_EQ(rgb->height, ref.height);
    EXPECT_EQ(rgb->channels, 3);
    EXPECT_TRUE(Bytes(*rgb) == File(name + ".rgb"));

    ImageDecodeOptions gray;
    gray.channels = 1;
    absl::StatusOr<DecodedImage> l = DecodeImage(bytes, gray);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->channels, 1);
    EXPECT_TRUE(Bytes(*l) == File(name + ".l"));
  }
}

TEST_F(ImageDecodeTest, Formats_ToldByMagicBytesNotName) {
  EXPECT_EQ(ReadImageHeader(File("rgb.png"))->format, ImageFormat::kPng);
  EXPECT_EQ(ReadImageHeader(File("rgb420.jpg"))->format, ImageFormat::kJpeg);
  EXPECT_EQ(ReadImageHeader(File("lossy.webp"))->format, ImageFormat::kWebp);
  absl::StatusOr<DecodedImage> text = DecodeImage("GIF89a not an image we decode");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("unknown image format"));
  EXPECT_EQ(DecodeImage("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ImageDecodeTest, JpegWindow_EqualsFullDecodeCropped) {
  const std::string bytes = File("big.jpg");
  for (int channels : {3, 1}) {
    ImageDecodeOptions options;
    options.channels = channels;
    absl::StatusOr<DecodedImage> full = DecodeImage(bytes, options);
    ASSERT_TRUE(full.ok()) << full.status();
    ASSERT_EQ(full->width, 203);
    ASSERT_EQ(full->height, 157);
    // Windows on and off iMCU boundaries (16 px for 4:2:0), at the edges and inside.
    std::vector<CropWindow> windows = {CropWindow{0, 0, 157, 203},  CropWindow{0, 0, 1, 1},
                                       CropWindow{17, 33, 100, 90}, CropWindow{16, 32, 64, 64},
                                       CropWindow{150, 190, 7, 13}, CropWindow{5, 0, 30, 203},
                                       CropWindow{0, 101, 157, 1},  CropWindow{79, 3, 1, 200}};
    std::mt19937 random(7);
    for (int i = 0; i < 300; ++i) {
      CropWindow w;
      w.top = std::uniform_int_distribution<int>(0, 156)(random);
      w.left = std::uniform_int_distribution<int>(0, 202)(random);
      w.height = std::uniform_int_distribution<int>(1, 157 - w.top)(random);
      w.width = std::uniform_int_distribution<int>(1, 203 - w.left)(random);
      windows.push_back(w);
    }
    for (const CropWindow& w : windows) {
      SCOPED_TRACE(
          absl::StrCat(channels, "ch window ", w.top, ",", w.left, " ", w.height, "x", w.width));
      absl::StatusOr<DecodedImage> part = DecodeImageWindow(bytes, w, options);
      ASSERT_TRUE(part.ok()) << part.status();
      ASSERT_EQ(part->height, w.height);
      ASSERT_EQ(part->width, w.width);
      bool equal = true;
      for (int y = 0; y < w.height && equal; ++y) {
        for (int x = 0; x < w.width * channels; ++x) {
          if (part->pixels[(y * w.width) * channels + x] !=
              full->pixels[((w.top + y) * full->width + w.left) * channels + x]) {
            equal = false;
            ADD_FAILURE() << "first difference at row " << y << " byte " << x;
            break;
          }
        }
      }
    }
  }
}

TEST_F(ImageDecodeTest, PngAndWebpWindow_EqualsFullDecodeCropped) {
  for (const char* name : {"rgba.png", "lossless.webp"}) {
    const std::string bytes = File(name);
    absl::StatusOr<DecodedImage> full = DecodeImage(bytes);
    ASSERT_TRUE(full.ok());
    absl::StatusOr<DecodedImage> part = DecodeImageWindow(bytes, CropWindow{3, 5, 20, 30});
    ASSERT_TRUE(part.ok()) << part.status();
    for (int y = 0; y < 20; ++y) {
      ASSERT_EQ(0, std::memcmp(&part->pixels[y * 30 * 3],
                               &full->pixels[((3 + y) * full->width + 5) * 3], 30 * 3))
          << name << " row " << y;
    }
  }
}

TEST_F(ImageDecodeTest, WindowOutsideImage_InvalidArgument) {
  for (CropWindow w : {CropWindow{0, 0, 0, 5}, CropWindow{-1, 0, 5, 5}, CropWindow{40, 0, 6, 5},
                       CropWindow{0, 60, 5, 8}}) {
    for (const char* name : {"rgb420.jpg", "rgb.png", "lossy.webp"}) {
      absl::StatusOr<DecodedImage> part = DecodeImageWindow(File(name), w);
      EXPECT_EQ(part.status().code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_THAT(part.status().message(), HasSubstr("not inside the 67x45 image")) << name;
    }
  }
}

TEST_F(ImageDecodeTest, Truncated_InvalidArgumentNamingFormat) {
  const std::map<std::string, std::string> formats = {
      {"rgb420.jpg", "JPEG image: "}, {"rgb.png", "PNG image: "}, {"lossy.webp", "WebP image: "}};
  for (const auto& [name, prefix] : formats) {
    const std::string bytes = File(name);
    for (size_t keep : {bytes.size() / 2, bytes.size() - 20, size_t{40}}) {
      absl::StatusOr<DecodedImage> cut = DecodeImage(bytes.substr(0, keep));
      ASSERT_FALSE(cut.ok()) << name << " cut to " << keep;
      EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(cut.status().message(), HasSubstr(prefix)) << cut.status();
      EXPECT_THAT(cut.status().message(),
                  ::testing::AnyOf(HasSubstr("truncated"), HasSubstr("corrupt")))
          << cut.status();
    }
  }
}

TEST_F(ImageDecodeTest, JpegTruncatedInScanData_SaysTruncated) {
  const std::string bytes = File("big.jpg");
  absl::StatusOr<DecodedImage> cut = DecodeImage(bytes.substr(0, bytes.size() * 2 / 3));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cut.status().message(), HasSubstr("JPEG image: corrupt: truncated"));
}

TEST_F(ImageDecodeTest, CorruptBytes_NeverCrash) {
  for (const char* name : {"rgb420.jpg", "progressive.jpg", "rgb.png", "lossy.webp"}) {
    std::string bytes = File(name);
    int failures = 0;
    for (size_t i = 20; i < bytes.size(); i += 7) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ 0x5A);
      absl::StatusOr<DecodedImage> image = DecodeImage(damaged);
      // JPEG's entropy data has no checksum, so a flipped byte may decode to other pixels;
      // either way the call returns.
      if (!image.ok()) {
        ++failures;
        EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
      }
    }
    if (std::string(name) == "rgb.png") {
      EXPECT_GT(failures, 0);  // PNG has CRCs
    }
  }
}

// A JPEG whose SOF claims 40000x40000 must be refused from the header, before allocating 4.8 GB.
TEST_F(ImageDecodeTest, HugeHeader_RefusedBeforeDecoding) {
  std::string bytes = File("rgb420.jpg");
  size_t sof = bytes.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  // SOF0: FF C0, length (2), precision (1), height (2), width (2).
  bytes[sof + 5] = static_cast<char>(40000 >> 8);
  bytes[sof + 6] = static_cast<char>(40000 & 0xFF);
  bytes[sof + 7] = static_cast<char>(40000 >> 8);
  bytes[sof + 8] = static_cast<char>(40000 & 0xFF);
  absl::StatusOr<DecodedImage> image = DecodeImage(bytes);
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(image.status().message(), HasSubstr("JPEG image: too large: 40000x40000"));

  ImageDecodeOptions small;
  small.limits.max_pixels = 1000;
  for (const char* name : {"rgb420.jpg", "rgb.png", "lossy.webp"}) {
    absl::StatusOr<DecodedImage> refused = DecodeImage(File(name), small);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(refused.status().message(), HasSubstr("too large: 67x45")) << name;
    EXPECT_FALSE(ReadImageHeader(File(name), small.limits).ok()) << name;
  }
}

TEST_F(ImageDecodeTest, BadChannels_InvalidArgument) {
  ImageDecodeOptions options;
  options.channels = 4;
  absl::StatusOr<DecodedImage> image = DecodeImage(File("rgb.png"), options);
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(image.status().message(), HasSubstr("channels must be 1 or 3"));
}

}  // namespace image_decode_test
}  // namespace dtrain

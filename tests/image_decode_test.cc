// DecodeImage against PIL: tests/python/torchvision_reference.py encodes images with PIL (libjpeg,
// libpng, libwebp underneath) and writes PIL's convert("RGB") and convert("L") pixels; each
// decode here must equal them byte for byte. Then the failures: damaged, truncated, oversized and
// unknown inputs each get INVALID_ARGUMENT naming the format and the reason.
#include "worker/data/image_decode.h"

// jpeglib.h needs <cstdio> (FILE) first.
// clang-format off
#include <cstdio>
#include <cstdlib>
#include <jpeglib.h>
// clang-format on
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

// A JPEG of `width` x `height` noisy gradients with the given sampling factors of the luma
// (the chroma components are 1x1), or grayscale; progressive or baseline. libjpeg's own encoder,
// so that every layout PIL does not write by default is covered. `unrefined`: progressive with
// the AC coefficients sent once, their last bit never refined, which makes a decoder smooth
// blocks.
std::string EncodeJpeg(int width, int height, int h_samp, int v_samp, bool gray, bool progressive,
                       bool unrefined = false) {
  std::mt19937 random(width * 31 + height);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / width + random() % 60);
      p[1] = static_cast<uint8_t>(y * 255 / height + random() % 60);
      p[2] = static_cast<uint8_t>((x + y) * 3 + random() % 60);
    }
  }
  jpeg_compress_struct cinfo;
  jpeg_error_mgr error;
  cinfo.err = jpeg_std_error(&error);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  if (gray) jpeg_set_colorspace(&cinfo, JCS_GRAYSCALE);
  cinfo.comp_info[0].h_samp_factor = h_samp;
  cinfo.comp_info[0].v_samp_factor = v_samp;
  if (progressive) jpeg_simple_progression(&cinfo);
  std::vector<jpeg_scan_info> scans;
  if (unrefined) {
    // The DC of every component whole, then each component's AC 1-63 without its last bit.
    jpeg_scan_info dc{};
    dc.comps_in_scan = cinfo.num_components;
    for (int c = 0; c < cinfo.num_components; ++c) dc.component_index[c] = c;
    scans.push_back(dc);
    for (int c = 0; c < cinfo.num_components; ++c) {
      jpeg_scan_info ac{};
      ac.comps_in_scan = 1;
      ac.component_index[0] = c;
      ac.Ss = 1;
      ac.Se = 63;
      ac.Al = 1;
      scans.push_back(ac);
    }
    cinfo.scan_info = scans.data();
    cinfo.num_scans = static_cast<int>(scans.size());
  }
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = &rgb[static_cast<size_t>(cinfo.next_scanline) * width * 3];
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string bytes(reinterpret_cast<const char*>(out), size);
  free(out);
  return bytes;
}

// libjpeg's own decode of the whole image with block smoothing off: for a file with unrefined
// coefficients it must differ from ours, or that case tests nothing smoothing-specific.
std::string DecodeWithoutSmoothing(const std::string& bytes) {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr error;
  cinfo.err = jpeg_std_error(&error);
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(&cinfo, TRUE);
  cinfo.do_block_smoothing = FALSE;
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
  std::string pixels(stride * cinfo.output_height, '\0');
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = reinterpret_cast<JSAMPROW>(&pixels[cinfo.output_scanline * stride]);
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return pixels;
}

// The window's rows out of a full decode, or out of a view: what both must equal.
std::string WindowOf(const DecodedImage& full, const CropWindow& w) {
  std::string rows;
  for (int y = 0; y < w.height; ++y) {
    const uint8_t* row =
        full.pixels.data() + (static_cast<size_t>(w.top + y) * full.width + w.left) * full.channels;
    rows.append(reinterpret_cast<const char*>(row), static_cast<size_t>(w.width) * full.channels);
  }
  return rows;
}
std::string RowsOf(const ImageWindowView& view) {
  std::string rows;
  for (int y = 0; y < view.height; ++y) {
    rows.append(reinterpret_cast<const char*>(view.pixels + y * view.row_stride),
                static_cast<size_t>(view.width) * view.channels);
  }
  return rows;
}

// The window decode asks libjpeg for 2 pixels more on each side of the window (fancy
// upsampling treats a cropped row's first and last pixels as the image's edge). Every left edge,
// narrow and wide windows, every sampling layout libjpeg writes, baseline and progressive.
TEST(ImageDecodeLayouts, JpegWindow_EveryLeftEdgeAndLayout_EqualsFullDecode) {
  struct Layout {
    int h, v;
    bool gray;
  };
  const std::vector<Layout> layouts = {{1, 1, false}, {2, 1, false}, {2, 2, false},
                                       {1, 2, false}, {4, 1, false}, {1, 1, true}};
  std::mt19937 random(11);
  for (const Layout& layout : layouts) {
    // Baseline, progressive, and progressive with unrefined AC (smoothed blocks: decoded from
    // the top at full width, as a crop would lose the neighbours smoothing reads).
    for (int scans : {0, 1, 2}) {
      const bool progressive = scans > 0;
      const int width = 93;
      const int height = 45;
      const std::string bytes =
          EncodeJpeg(width, height, layout.h, layout.v, layout.gray, progressive, scans == 2);
      if (scans == 2) {
        ImageDecodeOptions native;
        native.channels = layout.gray ? 1 : 3;
        absl::StatusOr<DecodedImage> smoothed = DecodeImage(bytes, native);
        ASSERT_TRUE(smoothed.ok()) << smoothed.status();
        EXPECT_NE(Bytes(*smoothed), DecodeWithoutSmoothing(bytes))
            << layout.h << "x" << layout.v << ": libjpeg did not smooth the unrefined file";
      }
      for (int channels : {3, 1}) {
        ImageDecodeOptions options;
        options.channels = channels;
        absl::StatusOr<DecodedImage> full = DecodeImage(bytes, options);
        ASSERT_TRUE(full.ok()) << full.status();
        int checked = 0;
        for (int left = 0; left < width; ++left) {
          for (int span : {1, 2, 3, 17, width}) {
            CropWindow w;
            w.left = left;
            w.width = std::min(span, width - left);
            w.top = static_cast<int>(random() % (height / 2));
            w.height = 1 + static_cast<int>(random() % (height - w.top));
            SCOPED_TRACE(absl::StrCat(
                layout.h, "x", layout.v, layout.gray ? " gray" : "",
                progressive ? " progressive" : "", scans == 2 ? " unrefined" : "", ", ", channels,
                " channels, window ", w.width, "x", w.height, "+", w.left, "+", w.top));
            absl::StatusOr<DecodedImage> part = DecodeImageWindow(bytes, w, options);
            ASSERT_TRUE(part.ok()) << part.status();
            ASSERT_EQ(Bytes(*part), WindowOf(*full, w));
            // A fresh scratch each time: a reused one, already grown, could hide one sized
            // too small.
            std::vector<uint8_t> scratch;
            absl::StatusOr<ImageWindowView> view = DecodeChosenWindow(
                bytes, options, [&](const ImageHeader&) { return w; }, scratch);
            ASSERT_TRUE(view.ok()) << view.status();
            ASSERT_EQ(RowsOf(*view), WindowOf(*full, w));
            ++checked;
          }
        }
        EXPECT_EQ(checked, width * 5);
      }
    }
  }
}

TEST_F(ImageDecodeTest, ChosenWindow_EqualsWindowDecode_ReusesScratch) {
  std::vector<uint8_t> scratch;
  for (const char* name : {"big.jpg", "rgb420.jpg", "rgb.png", "lossy.webp"}) {
    const std::string bytes = File(name);
    for (int channels : {3, 1}) {
      ImageDecodeOptions options;
      options.channels = channels;
      absl::StatusOr<DecodedImage> full = DecodeImage(bytes, options);
      ASSERT_TRUE(full.ok()) << full.status();
      for (int i = 0; i < 20; ++i) {
        ImageHeader seen;
        CropWindow w;
        absl::StatusOr<ImageWindowView> view = DecodeChosenWindow(
            bytes, options,
            [&](const ImageHeader& header) {
              seen = header;
              w.top = (i * 7) % (header.height / 2);
              w.left = (i * 13) % (header.width / 2);
              w.height = header.height - w.top - i % 3;
              w.width = header.width - w.left - i % 5;
              return w;
            },
            scratch);
        SCOPED_TRACE(absl::StrCat(name, " ", channels, " channels, window ", w.width, "x", w.height,
                                  "+", w.left, "+", w.top));
        ASSERT_TRUE(view.ok()) << view.status();
        EXPECT_EQ(seen.width, full->width);
        EXPECT_EQ(seen.height, full->height);
        EXPECT_EQ(view->channels, channels);
        EXPECT_EQ(view->height, w.height);
        EXPECT_EQ(view->width, w.width);
        ASSERT_EQ(RowsOf(*view), WindowOf(*full, w));
      }
    }
  }
  // Once the scratch holds the largest window, a JPEG decode allocates nothing: the same
  // buffer, and the view points into it.
  const std::string big = File("big.jpg");
  auto whole = [](const ImageHeader& h) { return CropWindow{0, 0, h.height, h.width}; };
  ASSERT_TRUE(DecodeChosenWindow(big, {}, whole, scratch).ok());
  const uint8_t* buffer = scratch.data();
  const size_t capacity = scratch.capacity();
  absl::StatusOr<ImageWindowView> again = DecodeChosenWindow(
      big, {},
      [](const ImageHeader&) {
        return CropWindow{10, 20, 30, 40};
      },
      scratch);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(scratch.data(), buffer);
  EXPECT_EQ(scratch.capacity(), capacity);
  EXPECT_GE(again->pixels, buffer);
  EXPECT_LT(again->pixels, buffer + capacity);
}

TEST_F(ImageDecodeTest, ChosenWindow_OutsideOrCorrupt_InvalidArgument) {
  std::vector<uint8_t> scratch;
  for (const char* name : {"rgb420.jpg", "rgb.png", "lossy.webp"}) {
    absl::StatusOr<ImageWindowView> outside = DecodeChosenWindow(
        File(name), {},
        [](const ImageHeader&) {
          return CropWindow{40, 0, 6, 5};
        },
        scratch);
    EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(outside.status().message(), HasSubstr("not inside the 67x45 image")) << name;
  }
  const std::string jpeg = File("rgb420.jpg");
  absl::StatusOr<ImageWindowView> cut = DecodeChosenWindow(
      jpeg.substr(0, jpeg.size() / 2), {},
      [](const ImageHeader& h) {
        return CropWindow{0, 0, h.height, h.width};
      },
      scratch);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cut.status().message(), HasSubstr("JPEG image: "));
  EXPECT_THAT(cut.status().message(), HasSubstr("truncated"));
}

}  // namespace image_decode_test
}  // namespace dtrain

// The fused crop + antialiased resize + normalize (worker/data/antialias_resample.h) without
// libtorch: the AVX2 path and the portable one give the same floats on upscales, downscales,
// one and three channels, flips and Normalizes; an output is in the range its Normalize allows;
// and a flat image stays flat. Its equality with torchvision's and ATen's operators is
// image_transforms_test's.
#include "worker/data/antialias_resample.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace antialias_resample_test {

std::vector<uint8_t> Noise(int h, int w, int channels, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> pixels(static_cast<size_t>(h) * w * channels);
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(gen() & 0xFF);
  return pixels;
}

std::vector<float> Resized(const std::vector<uint8_t>& pixels, int w, int channels, int top,
                           int left, int crop_h, int crop_w, CropResizeSpec spec, bool portable) {
  spec.portable = portable;
  const size_t n = static_cast<size_t>(channels) * spec.out_h * spec.out_w;
  // Aligned to 32 bytes, as a batch's rows are, so that the vector path streams its rows.
  std::vector<float> buffer(n + 8, -1000.0f);
  float* out = buffer.data();
  while (reinterpret_cast<uintptr_t>(out) % 32 != 0) ++out;
  CropResizeNormalize(pixels.data() + (static_cast<size_t>(top) * w + left) * channels,
                      int64_t{w} * channels, channels, crop_h, crop_w, spec, out);
  return std::vector<float>(out, out + n);
}

TEST(AntialiasResample, VectorAndPortablePathsGiveTheSameFloats) {
  struct Case {
    int h, w, channels, top, left, crop_h, crop_w, out_h, out_w;
    bool flip;
    int normalizes;
  };
  const Case cases[] = {
      {83, 61, 3, 5, 7, 40, 31, 224, 224, false, 1},     // upscale
      {320, 257, 3, 0, 0, 320, 257, 224, 224, true, 1},  // downscale, whole image
      {480, 640, 3, 17, 33, 400, 500, 17, 30, true, 2},  // strong downscale, two Normalizes
      {64, 64, 1, 3, 2, 50, 61, 224, 224, true, 0},      // one channel, no Normalize
      {300, 200, 1, 10, 20, 250, 150, 96, 128, false, 1},
      {300, 200, 1, 10, 20, 250, 150, 160, 128, false, 1},  // 80 KB: streamed rows
      {300, 200, 1, 10, 20, 250, 150, 160, 128, true, 1},
      {9, 9, 3, 0, 0, 1, 1, 5, 7, false, 0},  // a single pixel
      // Widths that are whole 8-output blocks take the 8-rows-at-a-time path: crops shorter
      // than a block, a last block of 1-7 rows, rows shorter than one 16-byte load, an edge of
      // the image at the crop's end, and more vertical taps than a ring of 16 rows.
      {5, 40, 3, 0, 0, 5, 40, 16, 8, false, 1},
      {1, 30, 3, 0, 0, 1, 30, 24, 32, true, 1},
      {21, 4, 3, 0, 1, 21, 3, 40, 16, false, 0},
      {19, 5, 1, 0, 0, 19, 5, 8, 8, true, 1},
      {257, 201, 3, 0, 0, 257, 201, 224, 224, false, 1},
      {300, 321, 3, 33, 17, 267, 304, 224, 224, true, 1},
      {640, 480, 3, 0, 0, 640, 480, 24, 16, true, 2},
  };
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.crop_h) + "x" + std::to_string(c.crop_w) + "x" +
                             std::to_string(c.channels) + " -> " + std::to_string(c.out_h) + "x" +
                             std::to_string(c.out_w);
    const std::vector<uint8_t> pixels = Noise(c.h, c.w, c.channels, c.h * 31 + c.w);
    CropResizeSpec spec;
    spec.out_h = c.out_h;
    spec.out_w = c.out_w;
    spec.flip = c.flip;
    for (int k = 0; k < c.normalizes; ++k) {
      for (int ch = 0; ch < c.channels; ++ch) {
        spec.means.push_back(0.4f + 0.05f * ch + 0.1f * k);
        spec.stds.push_back(0.2f + 0.01f * ch);
      }
    }
    const std::vector<float> fast =
        Resized(pixels, c.w, c.channels, c.top, c.left, c.crop_h, c.crop_w, spec, false);
    const std::vector<float> portable =
        Resized(pixels, c.w, c.channels, c.top, c.left, c.crop_h, c.crop_w, spec, true);
    ASSERT_EQ(fast.size(), portable.size());
    EXPECT_EQ(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)), 0) << what;
    if (c.normalizes == 0) {
      // ToTensor's range, and every element written (the fill was -1000).
      for (float v : fast) {
        ASSERT_GE(v, 0.0f) << what;
        ASSERT_LE(v, 1.0f) << what;
      }
    }
  }
}

// The vector path divides by a multiply and one correction only where that equals the division
// for every one of a channel's 256 levels (a check remembered per thread for the last spec). A
// subnormal std, whose reciprocal overflows, fails the check: that spec must still divide, and
// specs taking each way in turn must each give the portable path's floats.
TEST(AntialiasResample, NormalizeDividesExactlyWhateverItsStd) {
  const std::vector<uint8_t> pixels = Noise(90, 70, 3, 11);
  for (float sd : {1e-39f, 0.226f, 1e-39f, 0.226f}) {
    CropResizeSpec spec;
    spec.out_h = 40;
    spec.out_w = 48;
    spec.means = {0.0f, 0.5f, 0.0f};
    spec.stds = {sd, sd, sd};
    const std::vector<float> fast = Resized(pixels, 70, 3, 3, 4, 80, 60, spec, false);
    const std::vector<float> portable = Resized(pixels, 70, 3, 3, 4, 80, 60, spec, true);
    EXPECT_EQ(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)), 0) << sd;
    if (sd < 1e-30f) {
      // Red's levels over 1e-39: 0 for a black pixel, huge or infinite otherwise; never the
      // NaN that 0 times the reciprocal's infinity gives.
      for (size_t i = 0; i < 40 * 48; ++i) ASSERT_FALSE(std::isnan(fast[i])) << i;
    }
  }
}

TEST(AntialiasResample, AFlatImageStaysFlatAndAFlipMirrors) {
  std::vector<uint8_t> flat(100 * 80 * 3);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<uint8_t>(i % 3 == 0 ? 51 : 204);
  CropResizeSpec spec;
  spec.out_h = 33;
  spec.out_w = 47;
  const std::vector<float> out = Resized(flat, 80, 3, 10, 5, 70, 60, spec, false);
  const size_t plane = 33 * 47;
  for (size_t i = 0; i < plane; ++i) {
    ASSERT_EQ(out[i], 51.0f / 255) << i;               // red
    ASSERT_EQ(out[plane + i], 204.0f / 255) << i;      // green
    ASSERT_EQ(out[2 * plane + i], 204.0f / 255) << i;  // blue
  }
  const std::vector<uint8_t> pixels = Noise(40, 50, 1, 7);
  spec.out_h = 20;
  spec.out_w = 24;
  const std::vector<float> plain = Resized(pixels, 50, 1, 0, 0, 40, 50, spec, false);
  spec.flip = true;
  const std::vector<float> flipped = Resized(pixels, 50, 1, 0, 0, 40, 50, spec, false);
  for (int y = 0; y < 20; ++y) {
    for (int x = 0; x < 24; ++x) ASSERT_EQ(plain[y * 24 + x], flipped[y * 24 + 23 - x]);
  }
}

TEST(AntialiasResample, TapsCoverTheInputAndSumToOne) {
  for (auto [in, out] : {std::pair<int, int>{257, 224}, {40, 224}, {640, 17}, {1, 5}}) {
    const AntialiasTaps taps = ComputeAntialiasTaps(in, out);
    ASSERT_EQ(taps.first.size(), static_cast<size_t>(out));
    for (int i = 0; i < out; ++i) {
      ASSERT_GE(taps.first[i], 0);
      ASSERT_LE(taps.first[i] + taps.count[i], in);
      ASSERT_LE(taps.count[i], taps.stride);
      if (i > 0) {
        ASSERT_GE(taps.first[i], taps.first[i - 1]);
      }
      float sum = 0;
      for (int j = 0; j < taps.count[i]; ++j) sum += taps.weights[i * taps.stride + j];
      EXPECT_NEAR(sum, 1.0f, 1e-5f) << in << " -> " << out << " at " << i;
    }
  }
}

}  // namespace antialias_resample_test
}  // namespace dtrain

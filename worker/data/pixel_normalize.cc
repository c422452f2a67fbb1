#include "worker/data/pixel_normalize.h"

#include <cstddef>

namespace dtrain {

void PixelNormalize(const uint8_t* pixels, int height, int width, int channels,
                    const PixelNormalizeSpec& spec, float* out) {
  const int normalizes = channels > 0 ? static_cast<int>(spec.means.size()) / channels : 0;
  // A byte has 256 values: each channel's result is a table, made with the same float
  // operations in the same order as the ATen ops apply them to every element.
  float table[3][256];
  for (int c = 0; c < channels && c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float t = static_cast<float>(v) / 255;
      for (int k = 0; k < normalizes; ++k) {
        t = (t - spec.means[k * channels + c]) / spec.stds[k * channels + c];
      }
      table[c][v] = t;
    }
  }
  const size_t plane = static_cast<size_t>(height) * width;
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = pixels + static_cast<size_t>(y) * width * channels;
    for (int c = 0; c < channels && c < 3; ++c) {
      float* to = out + c * plane + static_cast<size_t>(y) * width;
      const float* lookup = table[c];
      if (spec.flip) {
        for (int x = 0; x < width; ++x) to[width - 1 - x] = lookup[row[x * channels + c]];
      } else {
        for (int x = 0; x < width; ++x) to[x] = lookup[row[x * channels + c]];
      }
    }
  }
}

}  // namespace dtrain

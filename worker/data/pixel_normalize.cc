#include "worker/data/pixel_normalize.h"

#include <cstddef>

namespace dtrain {

std::array<float, 256> PixelNormalizeTable(const PixelNormalizeSpec& spec, int channels, int c) {
  const int normalizes = channels > 0 ? static_cast<int>(spec.means.size()) / channels : 0;
  std::array<float, 256> table;
  for (int v = 0; v < 256; ++v) {
    float t = static_cast<float>(v) / 255;
    for (int k = 0; k < normalizes; ++k) {
      t = (t - spec.means[k * channels + c]) / spec.stds[k * channels + c];
    }
    table[v] = t;
  }
  return table;
}

void PixelNormalize(const uint8_t* pixels, int height, int width, int channels,
                    const PixelNormalizeSpec& spec, float* out) {
  // A byte has 256 values: each channel's result is a table.
  std::array<float, 256> table[3];
  for (int c = 0; c < channels && c < 3; ++c) table[c] = PixelNormalizeTable(spec, channels, c);
  const size_t plane = static_cast<size_t>(height) * width;
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = pixels + static_cast<size_t>(y) * width * channels;
    for (int c = 0; c < channels && c < 3; ++c) {
      float* to = out + c * plane + static_cast<size_t>(y) * width;
      const float* lookup = table[c].data();
      if (spec.flip) {
        for (int x = 0; x < width; ++x) to[width - 1 - x] = lookup[row[x * channels + c]];
      } else {
        for (int x = 0; x < width; ++x) to[x] = lookup[row[x * channels + c]];
      }
    }
  }
}

}  // namespace dtrain

// A transform list of only flips, ToTensor and Normalizes (Fashion-MNIST's, and most evaluation
// lists after a crop) as one pass over uint8 HWC pixels into float32 CHW: ToTensor's / 255 and
// each Normalize's (x - mean) / std in float, as the ATen ops compute them, without their
// intermediate tensors. image_transforms.cc checks it against those ops. Plain C++.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace dtrain {

struct PixelNormalizeSpec {
  bool flip = false;
  // Normalize's means and stds, `channels` per Normalize, applied in order.
  std::vector<float> means;
  std::vector<float> stds;
};

// Channel `c`'s result for each of a byte's 256 values (of `channels`; `spec`'s flip ignored),
// made with the same float operations in the same order as the ATen ops apply them to every
// element.
std::array<float, 256> PixelNormalizeTable(const PixelNormalizeSpec& spec, int channels, int c);

// `pixels`: height x width pixels of `channels` interleaved bytes. Writes channels x height x
// width floats to `out`.
void PixelNormalize(const uint8_t* pixels, int height, int width, int channels,
                    const PixelNormalizeSpec& spec, float* out);

}  // namespace dtrain

// The training pipeline's hot loop without libtorch: a crop of uint8 HWC pixels resized by ATen's
// antialiased bilinear filter (the arithmetic of UpSampleKernel.cpp, float for float), then
// round() to uint8, an optional horizontal flip, ToTensor's / 255 and each Normalize, written as
// float32 CHW. image_transforms.cc checks it against the ATen operators it replaces.
//
// Thread-safety: the functions keep per-thread scratch; call them from any number of threads.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

// One axis's taps: output index i reads `count[i]` inputs from `first[i]`, with the weights at
// weights[i * stride ...]. ATen's HelperInterpBase::_compute_weights_aa with the triangle filter,
// with its mixed float/double arithmetic kept, so that the weights are the same floats.
struct AntialiasTaps {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<float> weights;
  int stride = 0;  // >= every count
};
AntialiasTaps ComputeAntialiasTaps(int64_t input_size, int64_t output_size);

struct CropResizeSpec {
  int out_h = 0;
  int out_w = 0;
  bool flip = false;
  // Normalize's means and stds, `channels` per Normalize, applied in order.
  std::vector<float> means;
  std::vector<float> stds;
  // Run the path for CPUs without AVX2 and FMA even on one that has them, so that a test can
  // compare the two.
  bool portable = false;
};

// `pixels` points at the crop's top-left pixel; rows are `row_stride` bytes apart; the crop is
// in_h x in_w pixels of `channels` (1 or 3) interleaved bytes. Writes channels x out_h x out_w
// floats to `out`.
void CropResizeNormalize(const uint8_t* pixels, int64_t row_stride, int channels, int in_h,
                         int in_w, const CropResizeSpec& spec, float* out);

}  // namespace dtrain

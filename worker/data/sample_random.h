// The random parameters of torchvision's transforms, drawn per sample: a seed from (seed, epoch,
// sample key), so that a resumed job sees the same augmentations and each epoch another, and
// the draws of RandomResizedCrop and ColorJitter made as torchvision makes them. Plain C++, so
// that the pipeline's parameters can be tested without a tensor.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/string_view.h"
#include "dtrain/v1/transforms.pb.h"

namespace dtrain {

// The 64-bit seed of one sample's augmentations: a fixed function (splitmix64 over the seed and
// epoch, FNV-1a over the key's bytes) that does not change between runs, builds or machines.
uint64_t SampleSeed(uint64_t seed, int64_t epoch, absl::string_view sample_key);

// The random draws of one sample's transforms: mt19937_64 with distributions written out here
// (not std::uniform_*_distribution, whose results the C++ standard leaves to the library), so a
// given seed gives the same augmentations with any standard library.
class SampleRandom {
 public:
  explicit SampleRandom(uint64_t seed) : engine_(seed) {}
  // Uniform in [low, high).
  double Uniform(double low, double high);
  // Uniform integer in [low, high] (inclusive).
  int64_t UniformInt(int64_t low, int64_t high);
  // A uniformly random permutation of 0..n-1.
  std::vector<int> Permutation(int n);

 private:
  std::mt19937_64 engine_;  // its sequence is fixed by the standard
};

// RandomResizedCrop.get_params: (top, left, height, width) of the crop of a height x width image.
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};
CropBox RandomResizedCropParams(int height, int width, double scale_min, double scale_max,
                                double ratio_min, double ratio_max, SampleRandom& rng);

// ColorJitter's random draws, made as torchvision's ColorJitter.get_params makes them: the
// order of its four adjustments (0 brightness, 1 contrast, 2 saturation, 3 hue), then each
// factor uniform in [max(0, 1 - v), 1 + v] (negative: that adjustment is off) and the hue shift
// uniform in [-hue, hue].
struct ColorJitterParams {
  std::vector<int> order;
  double brightness = -1;
  double contrast = -1;
  double saturation = -1;
  double hue = 0;
};
ColorJitterParams DrawColorJitterParams(const v1::ImageTransform::ColorJitter& jitter,
                                        SampleRandom& rng);

}  // namespace dtrain

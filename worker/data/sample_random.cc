#include "worker/data/sample_random.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "worker/data/round_half_even.h"

namespace dtrain {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t SampleSeed(uint64_t seed, int64_t epoch, absl::string_view sample_key) {
  uint64_t key_hash = 0xCBF29CE484222325ull;  // FNV-1a 64
  for (char c : sample_key) {
    key_hash ^= static_cast<uint8_t>(c);
    key_hash *= 0x100000001B3ull;
  }
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(epoch)) ^ key_hash);
}

double SampleRandom::Uniform(double low, double high) {
  // 53 random bits: uniform in [0, 1) at double precision.
  const double unit = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
  return low + (high - low) * unit;
}

int64_t SampleRandom::UniformInt(int64_t low, int64_t high) {
  const uint64_t range = static_cast<uint64_t>(high - low) + 1;
  if (range == 0) return static_cast<int64_t>(engine_());  // the full 64-bit range
  // Rejection of the last partial block keeps every value equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  uint64_t x;
  do {
    x = engine_();
  } while (x >= limit);
  return low + static_cast<int64_t>(x % range);
}

std::vector<int> SampleRandom::Permutation(int n) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int i = n - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(order[i], order[UniformInt(0, i)]);
  }
  return order;
}

ColorJitterParams DrawColorJitterParams(const v1::ImageTransform::ColorJitter& jitter,
                                        SampleRandom& rng) {
  ColorJitterParams p;
  p.order = rng.Permutation(4);
  auto factor = [&rng](float v) { return rng.Uniform(std::max(0.0, 1.0 - v), 1.0 + v); };
  if (jitter.brightness() > 0) p.brightness = factor(jitter.brightness());
  if (jitter.contrast() > 0) p.contrast = factor(jitter.contrast());
  if (jitter.saturation() > 0) p.saturation = factor(jitter.saturation());
  if (jitter.hue() > 0) p.hue = rng.Uniform(-jitter.hue(), jitter.hue());
  return p;
}

CropBox RandomResizedCropParams(int height, int width, double scale_min, double scale_max,
                                double ratio_min, double ratio_max, SampleRandom& rng) {
  const double area = static_cast<double>(height) * width;
  const double log_ratio_min = std::log(ratio_min);
  const double log_ratio_max = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(scale_min, scale_max);
    const double aspect_ratio = std::exp(rng.Uniform(log_ratio_min, log_ratio_max));
    const int w = RoundHalfEven(std::sqrt(target_area * aspect_ratio));
    const int h = RoundHalfEven(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = static_cast<int>(rng.UniformInt(0, height - h));
      const int left = static_cast<int>(rng.UniformInt(0, width - w));
      return {top, left, h, w};
    }
  }
  // The center crop, clamped to the ratio range.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width;
  int h = height;
  if (in_ratio < ratio_min) {
    h = RoundHalfEven(w / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = RoundHalfEven(h * ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

}  // namespace dtrain

// The fused crop + antialiased resize + ToTensor + Normalize alone
// (worker/data/antialias_resample.h) on one thread: random crops of 70-300 px a side of a 320x320
// RGB image to 224x224, half of them flipped, ImageNet's Normalize; the vector path against the
// portable one (the same floats, scalar code) in the same run. Prints one JSON row per path:
//   {"system": ..., "samples": N, "us_per_sample": T}
// and the best of --reps passes of --samples crops each. Run: bench/resize.sh.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "worker/data/antialias_resample.h"

ABSL_FLAG(int, samples, 3000, "crops per pass");
ABSL_FLAG(int, reps, 5, "passes per path; the fastest is reported");

namespace {

double BestMicrosPerSample(bool portable, const std::vector<uint8_t>& image, int side, float* out) {
  dtrain::CropResizeSpec spec;
  spec.out_h = 224;
  spec.out_w = 224;
  spec.means = {0.485f, 0.456f, 0.406f};
  spec.stds = {0.229f, 0.224f, 0.225f};
  spec.portable = portable;
  const int samples = absl::GetFlag(FLAGS_samples);
  double best = 1e30;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    std::mt19937 gen(5);  // the same crops for every pass and path
    std::uniform_int_distribution<int> crop(70, 300);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < samples; ++i) {
      const int h = crop(gen);
      const int w = crop(gen);
      spec.flip = (i & 1) != 0;
      dtrain::CropResizeNormalize(image.data(), int64_t{side} * 3, 3, h, w, spec, out);
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s / samples * 1e6);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  constexpr int kSide = 320;
  std::mt19937 gen(1);
  std::vector<uint8_t> image(kSide * kSide * 3);
  for (uint8_t& p : image) p = static_cast<uint8_t>(gen() & 0xFF);
  // 32-byte aligned, as a batch's rows are, so that the vector path streams its rows.
  std::vector<float> buffer(3 * 224 * 224 + 8);
  float* out = buffer.data();
  while (reinterpret_cast<uintptr_t>(out) % 32 != 0) ++out;
  // Without AVX2 and FMA the "vector" row runs the portable path too, and says so.
  const bool vector = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  for (bool portable : {false, true}) {
    const double us = BestMicrosPerSample(portable, image, kSide, out);
    std::printf("{\"system\": \"%s\", \"samples\": %d, \"us_per_sample\": %.1f}\n",
                portable ? "portable (scalar)"
                : vector ? "vector (AVX2 + FMA)"
                         : "vector path unavailable (no AVX2/FMA): portable",
                absl::GetFlag(FLAGS_samples), us);
  }
  return 0;
}

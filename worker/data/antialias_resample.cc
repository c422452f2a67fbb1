#include "worker/data/antialias_resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dtrain {
namespace {

float TriangleFilter(float x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return static_cast<float>(1.0 - x);
  return 0.0f;
}

// The horizontal pass of one input row, into `dst` planar (c * out_w + x): the vertical pass
// then runs along whole rows. Each output starts from its first tap's product and adds the
// others with a fused multiply-add, in ATen's order: ATen's kernel, built for AVX2 and up,
// contracts `out += t * w` into an FMA, so the same roundings give the same floats.
//
// Three channels go together as one 4-float vector per tap (the fourth lane reads the next
// pixel's red and is dropped): consecutive taps are consecutive pixels, so this needs no
// gather, which a vector loop over x would. `line` holds in_w * channels + 1 floats.
void ToFloatLine(const uint8_t* __restrict src, int n, float* __restrict line) {
  for (int i = 0; i < n; ++i) line[i] = static_cast<float>(src[i]);
  line[n] = 0.0f;  // the fourth lane of the last pixel
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v3"), noinline)) void RgbRowFma(const float* __restrict line,
                                                                   const AntialiasTaps& taps,
                                                                   int out_w,
                                                                   float* __restrict dst) {
  for (int x = 0; x < out_w; ++x) {
    const float* w = taps.weights.data() + static_cast<size_t>(x) * taps.stride;
    const float* p = line + taps.first[x] * 3;
    __m128 a = _mm_mul_ps(_mm_loadu_ps(p), _mm_set1_ps(w[0]));
    const int count = taps.count[x];
    for (int j = 1; j < count; ++j) {
      p += 3;
      a = _mm_fmadd_ps(_mm_loadu_ps(p), _mm_set1_ps(w[j]), a);
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, a);
    dst[x] = lanes[0];
    dst[out_w + x] = lanes[1];
    dst[2 * out_w + x] = lanes[2];
  }
}

// A finished output row, written past the caches (the output is a batch far larger than them,
// read next by the step): no read-for-ownership of each line before it is overwritten. False
// when the row is not whole aligned 8-float blocks; the caller copies it then.
__attribute__((target("arch=x86-64-v3"), noinline)) bool StreamRow(const float* __restrict from,
                                                                   int n, bool flip,
                                                                   float* __restrict to) {
  if (n % 8 != 0 || reinterpret_cast<uintptr_t>(to) % 32 != 0) return false;
  if (flip) {
    const __m256i reverse = _mm256_set_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int x = 0; x < n; x += 8) {
      _mm256_stream_ps(to + n - 8 - x,
                       _mm256_permutevar8x32_ps(_mm256_loadu_ps(from + x), reverse));
    }
  } else {
    for (int x = 0; x < n; x += 8) _mm256_stream_ps(to + x, _mm256_loadu_ps(from + x));
  }
  return true;
}
#endif

// The same with std::fma (glibc's where the CPU has no FMA: exact, slower), and one channel.
void RowFma(const float* __restrict line, int channels, const AntialiasTaps& taps, int out_w,
            float* __restrict dst) {
  for (int x = 0; x < out_w; ++x) {
    const float* w = taps.weights.data() + static_cast<size_t>(x) * taps.stride;
    const int count = taps.count[x];
    for (int c = 0; c < channels; ++c) {
      const float* p = line + taps.first[x] * channels + c;
      float a = p[0] * w[0];
      for (int j = 1; j < count; ++j) a = std::fma(p[j * channels], w[j], a);
      dst[c * out_w + x] = a;
    }
  }
}

// Both passes, one output row at a time: the horizontal rows that the vertical taps read are
// made as they are first needed, into a ring of `vertical.stride` rows, so they stay in the
// first-level cache instead of a whole-crop buffer's trip through memory. The vertical pass,
// round() and .to(uint8), ToTensor's / 255 and each Normalize run in float as the ATen ops
// compute them, along whole rows so that the compiler vectorises them; each element still sees
// the same operations in the same order.
template <bool kAvx2>
inline __attribute__((always_inline)) void ResampleBody(const uint8_t* __restrict pixels,
                                                        int64_t row_stride, int channels, int in_w,
                                                        const AntialiasTaps& horizontal,
                                                        const AntialiasTaps& vertical,
                                                        const CropResizeSpec& spec,
                                                        float* __restrict out) {
  const int out_h = spec.out_h;
  const int out_w = spec.out_w;
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  const int row = out_w * channels;
  const int normalizes = static_cast<int>(spec.means.size()) / channels;
  const int ring_rows = std::max(1, vertical.stride);
  // A sample of 64 KB and more is a batch of megabytes, which the step reads from memory anyway:
  // its rows are streamed. A small one (28x28) may stay in the caches for the step.
  [[maybe_unused]] const bool stream = plane * channels * sizeof(float) >= 64 * 1024;
  thread_local std::vector<float> line;
  thread_local std::vector<float> ring;
  thread_local std::vector<float> scratch;
  line.resize(static_cast<size_t>(in_w) * channels + 1);
  ring.resize(static_cast<size_t>(ring_rows) * row);
  scratch.resize(static_cast<size_t>(row) * (1 + 2 * normalizes));
  float* __restrict acc = scratch.data();
  // Each Normalize's mean and std spread along a row (planar: element i is channel i / out_w).
  float* row_means = acc + row;
  float* row_stds = row_means + static_cast<size_t>(row) * normalizes;
  for (int k = 0; k < normalizes; ++k) {
    for (int i = 0; i < row; ++i) {
      row_means[k * row + i] = spec.means[k * channels + i / out_w];
      row_stds[k * row + i] = spec.stds[k * channels + i / out_w];
    }
  }
  // Taps' first and first + count never decrease with the output index, and count <= stride,
  // so the rows an output reads are always among the ring's newest.
  int next = 0;  // the next input row to resample horizontally
  for (int y = 0; y < out_h; ++y) {
    const int first = vertical.first[y];
    const int count = vertical.count[y];
    next = std::max(next, first);
    for (; next < first + count; ++next) {
      float* dst = ring.data() + static_cast<size_t>(next % ring_rows) * row;
      ToFloatLine(pixels + next * row_stride, in_w * channels, line.data());
#if defined(__x86_64__)
      if constexpr (kAvx2) {
        if (channels == 3) {
          RgbRowFma(line.data(), horizontal, out_w, dst);
          continue;
        }
      }
#endif
      RowFma(line.data(), channels, horizontal, out_w, dst);
    }
    const float* w = &vertical.weights[static_cast<size_t>(y) * vertical.stride];
    const float* __restrict r0 = ring.data() + static_cast<size_t>(first % ring_rows) * row;
    const float w0 = w[0];
    for (int i = 0; i < row; ++i) acc[i] = r0[i] * w0;
    for (int j = 1; j < count; ++j) {
      const float* __restrict rj = ring.data() + static_cast<size_t>((first + j) % ring_rows) * row;
      const float wj = w[j];
      for (int i = 0; i < row; ++i) acc[i] = std::fma(rj[i], wj, acc[i]);
    }
    // round() then .to(uint8): no clamp, as in torchvision; the weights are positive and sum to
    // 1, so the value is within [0, 255] already. Adding and subtracting 2^23 rounds a float in
    // [0, 2^22) to the nearest integer, ties to even, exactly as round() (nearbyint) does, and
    // unlike that call it vectorises.
    constexpr float kRound = 8388608.0f;
    for (int i = 0; i < row; ++i) acc[i] = ((acc[i] + kRound) - kRound) / 255;
    for (int k = 0; k < normalizes; ++k) {
      const float* m = row_means + static_cast<size_t>(k) * row;
      const float* sd = row_stds + static_cast<size_t>(k) * row;
      for (int i = 0; i < row; ++i) acc[i] = (acc[i] - m[i]) / sd[i];
    }
    for (int c = 0; c < channels; ++c) {
      const float* __restrict from = acc + static_cast<size_t>(c) * out_w;
      float* __restrict to = out + c * plane + static_cast<size_t>(y) * out_w;
#if defined(__x86_64__)
      if constexpr (kAvx2) {
        if (stream && StreamRow(from, out_w, spec.flip, to)) continue;
      }
#endif
      if (spec.flip) {
        for (int x = 0; x < out_w; ++x) to[out_w - 1 - x] = from[x];
      } else {
        std::memcpy(to, from, sizeof(float) * out_w);
      }
    }
  }
#if defined(__x86_64__)
  if constexpr (kAvx2) _mm_sfence();  // the streamed stores before the batch is handed on
#endif
}

// Built twice, for x86-64-v3 (AVX2, FMA: the vertical loops become vector FMAs) and without,
// and chosen by the CPU at run time.
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v3"))) void ResampleAvx2(
    const uint8_t* pixels, int64_t row_stride, int channels, int in_w,
    const AntialiasTaps& horizontal, const AntialiasTaps& vertical, const CropResizeSpec& spec,
    float* out) {
  ResampleBody<true>(pixels, row_stride, channels, in_w, horizontal, vertical, spec, out);
}
#endif

void ResamplePortable(const uint8_t* pixels, int64_t row_stride, int channels, int in_w,
                      const AntialiasTaps& horizontal, const AntialiasTaps& vertical,
                      const CropResizeSpec& spec, float* out) {
  ResampleBody<false>(pixels, row_stride, channels, in_w, horizontal, vertical, spec, out);
}

bool HasAvx2Fma() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

}  // namespace

AntialiasTaps ComputeAntialiasTaps(int64_t input_size, int64_t output_size) {
  const float scale = static_cast<float>(input_size) / output_size;
  const float support = (scale >= 1.0) ? static_cast<float>((2 * 0.5) * scale) : 2 * 0.5f;
  AntialiasTaps taps;
  taps.stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(output_size);
  taps.count.resize(output_size);
  taps.weights.assign(static_cast<size_t>(output_size) * taps.stride, 0.0f);
  for (int64_t i = 0; i < output_size; ++i) {
    const float center = static_cast<float>(scale * (i + 0.5));
    const float invscale = (scale >= 1.0) ? static_cast<float>(1.0 / scale) : 1.0f;
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    const int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), input_size) - xmin;
    float* w = &taps.weights[i * taps.stride];
    float total = 0.0f;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = TriangleFilter(static_cast<float>((j + xmin - center + 0.5) * invscale));
      total += w[j];
    }
    for (int64_t j = 0; j < xsize; ++j) {
      if (total != 0.0) w[j] /= total;
    }
    taps.first[i] = static_cast<int>(xmin);
    taps.count[i] = static_cast<int>(xsize);
  }
  return taps;
}

void CropResizeNormalize(const uint8_t* pixels, int64_t row_stride, int channels, int in_h,
                         int in_w, const CropResizeSpec& spec, float* out) {
  const AntialiasTaps horizontal = ComputeAntialiasTaps(in_w, spec.out_w);
  const AntialiasTaps vertical = ComputeAntialiasTaps(in_h, spec.out_h);
#if defined(__x86_64__)
  if (!spec.portable && HasAvx2Fma()) {
    ResampleAvx2(pixels, row_stride, channels, in_w, horizontal, vertical, spec, out);
    return;
  }
#endif
  ResamplePortable(pixels, row_stride, channels, in_w, horizontal, vertical, spec, out);
}

}  // namespace dtrain

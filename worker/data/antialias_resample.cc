#include "worker/data/antialias_resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

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

#if defined(__x86_64__)
// An 8x8 block of floats transposed in registers: v[r][i] becomes v[i][r].
__attribute__((target("arch=x86-64-v3"))) inline void Transpose8x8(__m256 v[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]);
  const __m256 t1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]);
  const __m256 t3 = _mm256_unpackhi_ps(v[2], v[3]);
  const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]);
  const __m256 t5 = _mm256_unpackhi_ps(v[4], v[5]);
  const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]);
  const __m256 t7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  v[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  v[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  v[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  v[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// The horizontal taps as EightRowsFma reads them: every output with the same number of taps
// (the most any has; the others' extra weights are 0, and adding 0 times a pixel, or a 0 column
// past the row's end, leaves the sum's float as it was), each output's first column as an
// offset into the columns, and the kernel compiled for that number of taps.
struct HorizontalPlan;
using HorizontalKernel = void (*)(const float* columns, int channels, int out_w,
                                  const HorizontalPlan& plan, int rows, float* const dst[8]);
struct HorizontalPlan {
  int taps = 0;
  std::vector<int> offset;     // per output: its first tap's column * channels * 8
  std::vector<float> weights;  // per output, `taps` of them
  HorizontalKernel run = nullptr;
};

template <int kTaps>
__attribute__((target("arch=x86-64-v3"))) void HorizontalTaps(const float* __restrict columns,
                                                              int channels, int out_w,
                                                              const HorizontalPlan& plan, int rows,
                                                              float* const dst[8]) {
  const int taps = kTaps > 0 ? kTaps : plan.taps;
  const size_t step = static_cast<size_t>(channels) * 8;
  const int* offset = plan.offset.data();
  const float* weights = plan.weights.data();
  for (int c = 0; c < channels; ++c) {
    const float* channel = columns + c * 8;
    for (int x0 = 0; x0 < out_w; x0 += 8) {
      __m256 v[8];
      for (int k = 0; k < 8; ++k) {
        const float* p = channel + offset[x0 + k];
        const float* w = weights + static_cast<size_t>(x0 + k) * taps;
        __m256 a = _mm256_mul_ps(_mm256_load_ps(p), _mm256_broadcast_ss(w));
        for (int j = 1; j < taps; ++j) {
          a = _mm256_fmadd_ps(_mm256_load_ps(p + j * step), _mm256_broadcast_ss(w + j), a);
        }
        v[k] = a;
      }
      Transpose8x8(v);
      for (int r = 0; r < rows; ++r) _mm256_storeu_ps(dst[r] + c * out_w + x0, v[r]);
    }
  }
}

void PlanHorizontal(const AntialiasTaps& taps, int channels, HorizontalPlan& plan) {
  const int out = static_cast<int>(taps.first.size());
  plan.taps = 1;
  for (int x = 0; x < out; ++x) plan.taps = std::max(plan.taps, taps.count[x]);
  plan.offset.resize(out);
  plan.weights.assign(static_cast<size_t>(out) * plan.taps, 0.0f);
  for (int x = 0; x < out; ++x) {
    plan.offset[x] = taps.first[x] * channels * 8;
    for (int j = 0; j < taps.count[x]; ++j) {
      plan.weights[static_cast<size_t>(x) * plan.taps + j] = taps.weights[x * taps.stride + j];
    }
  }
  switch (plan.taps) {
    case 1:
      plan.run = HorizontalTaps<1>;
      break;
    case 2:
      plan.run = HorizontalTaps<2>;
      break;
    case 3:
      plan.run = HorizontalTaps<3>;
      break;
    case 4:
      plan.run = HorizontalTaps<4>;
      break;
    case 5:
      plan.run = HorizontalTaps<5>;
      break;
    case 6:
      plan.run = HorizontalTaps<6>;
      break;
    default:
      plan.run = HorizontalTaps<0>;
      break;
  }
}

// Eight input rows' horizontal pass at once. Within a row, an output's taps are consecutive
// pixels, so a vector across outputs would need a gather; across rows it needs none. The rows'
// bytes are transposed (16 bytes of each of 8 rows at a time, by unpacking) so that byte b of
// every row lies in one 8-float column (columns[b * 8 + r]), converted to floats: then a tap is
// one broadcast weight times one aligned 8-float load, the arithmetic of RowFma for 8 rows
// (HorizontalTaps). `rows` < 8 repeats the last row and drops its results. `columns` is 32-byte
// aligned and holds in_w * channels * 8 floats, then the zeros that the plan's padded taps read.
__attribute__((target("arch=x86-64-v3"), noinline)) void EightRowsFma(
    const uint8_t* pixels, int64_t row_stride, int rows, int channels, int in_w,
    const HorizontalPlan& plan, int out_w, float* const dst[8], float* __restrict columns) {
  const uint8_t* src[8];
  for (int r = 0; r < 8; ++r) src[r] = pixels + std::min(r, rows - 1) * row_stride;
  const int bytes = in_w * channels;
  int b = 0;
  for (; b + 16 <= bytes; b += 16) {
    __m128i v[8];
    for (int r = 0; r < 8; ++r) {
      v[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[r] + b));
    }
    // Bytes of rows (0,1), (2,3), ... interleaved, then their pairs, then their quads: each
    // 8-byte half of q[k] is one byte offset's column of 8 rows.
    __m128i p[8], q[8];
    for (int k = 0; k < 4; ++k) {
      p[2 * k] = _mm_unpacklo_epi8(v[2 * k], v[2 * k + 1]);
      p[2 * k + 1] = _mm_unpackhi_epi8(v[2 * k], v[2 * k + 1]);
    }
    for (int k = 0; k < 2; ++k) {
      q[4 * k] = _mm_unpacklo_epi16(p[4 * k], p[4 * k + 2]);
      q[4 * k + 1] = _mm_unpackhi_epi16(p[4 * k], p[4 * k + 2]);
      q[4 * k + 2] = _mm_unpacklo_epi16(p[4 * k + 1], p[4 * k + 3]);
      q[4 * k + 3] = _mm_unpackhi_epi16(p[4 * k + 1], p[4 * k + 3]);
    }
    // q[0..3] hold rows 0-3 of bytes 0-3, 4-7, 8-11, 12-15 (4 bytes a column); q[4..7] rows 4-7.
    for (int k = 0; k < 4; ++k) {
      const __m128i lo = _mm_unpacklo_epi32(q[k], q[4 + k]);  // bytes 4k, 4k + 1
      const __m128i hi = _mm_unpackhi_epi32(q[k], q[4 + k]);  // bytes 4k + 2, 4k + 3
      float* out = columns + static_cast<size_t>(b + 4 * k) * 8;
      _mm256_store_ps(out, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)));
      _mm256_store_ps(out + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))));
      _mm256_store_ps(out + 16, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)));
      _mm256_store_ps(out + 24, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
    }
  }
  for (; b < bytes; ++b) {  // the row's last bytes; reading 16 could pass the image's end
    for (int r = 0; r < 8; ++r) columns[static_cast<size_t>(b) * 8 + r] = src[r][b];
  }
  plan.run(columns, channels, out_w, plan, rows, dst);
}

// Division by a constant as a multiply and one correction: the residual a - q * d is exact with
// an FMA, and one step with it gives the correctly rounded quotient for all but rare inputs.
// Here the inputs are few (256 levels per channel), so FinishPlan checks each of them against the
// division and keeps the division when any differs.
__attribute__((target("arch=x86-64-v3"))) inline __m256 DivideByMultiply(__m256 a, __m256 d,
                                                                         __m256 inverse) {
  const __m256 q = _mm256_mul_ps(a, inverse);
  return _mm256_fmadd_ps(_mm256_fnmadd_ps(q, d, a), inverse, q);
}

float DivideByMultiplyScalar(float a, float d, float inverse) {
  const float q = a * inverse;
  return std::fma(std::fma(-q, d, a), inverse, q);
}

// Bit for bit: == would take -0 for +0, and a NaN for nothing.
bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// Whether DivideByMultiply equals the division at every value the finishing steps see: a
// rounded output is one of 256 levels, so ToTensor's / 255 and each Normalize of a channel see
// 256 values each. Remembered per thread for the last means and stds (a split's are fixed).
bool FinishByMultiply(const CropResizeSpec& spec, int channels) {
  thread_local std::vector<float> means;
  thread_local std::vector<float> stds;
  thread_local int checked_channels = 0;
  thread_local bool exact = false;
  if (checked_channels == channels && SameBits(means, spec.means) && SameBits(stds, spec.stds)) {
    return exact;
  }
  exact = true;
  const int normalizes = static_cast<int>(spec.means.size()) / channels;
  for (int c = 0; c < channels && exact; ++c) {
    for (int level = 0; level < 256 && exact; ++level) {
      float v = static_cast<float>(level);
      exact = SameBits(DivideByMultiplyScalar(v, 255.0f, 1.0f / 255.0f), v / 255);
      v /= 255;
      for (int k = 0; k < normalizes && exact; ++k) {
        const float t = v - spec.means[k * channels + c];
        const float sd = spec.stds[k * channels + c];
        v = t / sd;
        exact = SameBits(DivideByMultiplyScalar(t, sd, 1.0f / sd), v);
      }
    }
  }
  means = spec.means;
  stds = spec.stds;
  checked_channels = channels;
  return exact;
}

// The vertical pass, round(), / 255 and each Normalize of one output row, 8 outputs at a time
// in registers, each element through the same operations in the same order as ResampleBody's
// loops, and stored (flipped, streamed when `stream`) straight into the output. out_w % 8 == 0.
template <bool kByMultiply, bool kFlip, bool kStream>
__attribute__((target("arch=x86-64-v3"))) void FinishRowAvx2(const float* const* ring_rows,
                                                             const float* w, int count,
                                                             int channels, int out_w,
                                                             const CropResizeSpec& spec,
                                                             float* out_row, size_t plane) {
  const int normalizes = static_cast<int>(spec.means.size()) / channels;
  const __m256 round = _mm256_set1_ps(8388608.0f);
  const __m256 d255 = _mm256_set1_ps(255.0f);
  const __m256 i255 = _mm256_set1_ps(1.0f / 255.0f);
  const __m256i reverse = _mm256_set_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // Locals, not reads through `spec` or `ring_rows` in the loop: a float store to the output
  // could alias them as far as the compiler knows, so it would reload them (and divide 1 / sd)
  // for every vector.
  const __m256 w0 = _mm256_set1_ps(w[0]);
  const __m256 w1 = _mm256_set1_ps(count > 1 ? w[1] : 0.0f);
  const __m256 w2 = _mm256_set1_ps(count > 2 ? w[2] : 0.0f);
  for (int c = 0; c < channels; ++c) {
    float* to_row = out_row + c * plane;
    const size_t offset = static_cast<size_t>(c) * out_w;
    const float* r0 = ring_rows[0] + offset;
    const float* r1 = ring_rows[count > 1 ? 1 : 0] + offset;
    const float* r2 = ring_rows[count > 2 ? 2 : 0] + offset;
    // The first Normalize in registers; further ones (rare) read `spec`.
    const float sd = normalizes > 0 ? spec.stds[c] : 1.0f;
    const __m256 mean0 = _mm256_set1_ps(normalizes > 0 ? spec.means[c] : 0.0f);
    const __m256 sd0 = _mm256_set1_ps(sd);
    const __m256 inverse0 = _mm256_set1_ps(1.0f / sd);
    for (int x = 0; x < out_w; x += 8) {
      __m256 a = _mm256_mul_ps(_mm256_loadu_ps(r0 + x), w0);
      if (count > 1) a = _mm256_fmadd_ps(_mm256_loadu_ps(r1 + x), w1, a);
      if (count > 2) a = _mm256_fmadd_ps(_mm256_loadu_ps(r2 + x), w2, a);
      for (int j = 3; j < count; ++j) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(ring_rows[j] + offset + x), _mm256_set1_ps(w[j]), a);
      }
      a = _mm256_sub_ps(_mm256_add_ps(a, round), round);
      a = kByMultiply ? DivideByMultiply(a, d255, i255) : _mm256_div_ps(a, d255);
      if (normalizes > 0) {
        a = _mm256_sub_ps(a, mean0);
        a = kByMultiply ? DivideByMultiply(a, sd0, inverse0) : _mm256_div_ps(a, sd0);
      }
      for (int k = 1; k < normalizes; ++k) {
        const float sdk = spec.stds[k * channels + c];
        a = _mm256_sub_ps(a, _mm256_set1_ps(spec.means[k * channels + c]));
        a = kByMultiply ? DivideByMultiply(a, _mm256_set1_ps(sdk), _mm256_set1_ps(1.0f / sdk))
                        : _mm256_div_ps(a, _mm256_set1_ps(sdk));
      }
      float* to = to_row + (kFlip ? out_w - 8 - x : x);
      if (kFlip) a = _mm256_permutevar8x32_ps(a, reverse);
      if (kStream) {
        _mm256_stream_ps(to, a);
      } else {
        _mm256_storeu_ps(to, a);
      }
    }
  }
}

using FinishRowFn = void (*)(const float* const*, const float*, int, int, int,
                             const CropResizeSpec&, float*, size_t);
template <bool kByMultiply, bool kFlip>
FinishRowFn FinishRowFor(bool stream) {
  return stream ? FinishRowAvx2<kByMultiply, kFlip, true>
                : FinishRowAvx2<kByMultiply, kFlip, false>;
}
FinishRowFn FinishRowFor(bool by_multiply, bool flip, bool stream) {
  if (by_multiply)
    return flip ? FinishRowFor<true, true>(stream) : FinishRowFor<true, false>(stream);
  return flip ? FinishRowFor<false, true>(stream) : FinishRowFor<false, false>(stream);
}

// Both passes for out_w % 8 == 0 on AVX2: input rows 8 at a time (EightRowsFma) into a ring of
// rows, then each output row finished in registers (FinishRowAvx2).
__attribute__((target("arch=x86-64-v3"))) void ResampleBlocksAvx2(
    const uint8_t* pixels, int64_t row_stride, int channels, int in_h, int in_w,
    const AntialiasTaps& horizontal, const AntialiasTaps& vertical, const CropResizeSpec& spec,
    float* out) {
  const int out_h = spec.out_h;
  const int out_w = spec.out_w;
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  const int row = out_w * channels;
  // The rows an output reads end at most 7 rows before the newest of its block (see ResampleBody).
  const int ring_rows = std::max(1, vertical.stride) + 8;
  const bool stream = plane * channels * sizeof(float) >= 64 * 1024 &&
                      reinterpret_cast<uintptr_t>(out) % 32 == 0 && plane % 8 == 0;
  const FinishRowFn finish = FinishRowFor(FinishByMultiply(spec, channels), spec.flip, stream);
  thread_local std::vector<float> ring;
  thread_local std::vector<float> columns;
  ring.resize(static_cast<size_t>(ring_rows) * row);
  thread_local HorizontalPlan plan;
  PlanHorizontal(horizontal, channels, plan);
  // The row's columns, then zeros for the taps that pad the last outputs' past its end.
  const size_t filled = static_cast<size_t>(in_w) * channels * 8;
  columns.resize(filled + static_cast<size_t>(plan.taps) * channels * 8 + 8);
  float* aligned_columns = columns.data();
  while (reinterpret_cast<uintptr_t>(aligned_columns) % 32 != 0) ++aligned_columns;
  std::fill(aligned_columns + filled, columns.data() + columns.size(), 0.0f);
  auto ring_row = [&](int r) { return ring.data() + static_cast<size_t>(r % ring_rows) * row; };
  int next = 0;  // the first input row not resampled horizontally yet
  thread_local std::vector<const float*> reads;
  reads.resize(std::max(1, vertical.stride));
  for (int y = 0; y < out_h; ++y) {
    const int first = vertical.first[y];
    const int count = vertical.count[y];
    next = std::max(next, first);
    while (next < first + count) {
      const int block = std::min(8, in_h - next);
      float* dst[8];
      for (int r = 0; r < 8; ++r) dst[r] = ring_row(next + std::min(r, block - 1));
      EightRowsFma(pixels + next * row_stride, row_stride, block, channels, in_w, plan, out_w, dst,
                   aligned_columns);
      next += block;
    }
    for (int j = 0; j < count; ++j) reads[j] = ring_row(first + j);
    finish(reads.data(), &vertical.weights[static_cast<size_t>(y) * vertical.stride], count,
           channels, out_w, spec, out + static_cast<size_t>(y) * out_w, plane);
  }
  if (stream) _mm_sfence();  // the streamed stores before the batch is handed on
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
  // The taps of each (crop side, output side) a thread has met: a random crop's sides take a
  // few hundred values, and the taps' double arithmetic cost more than a lookup. Past kCached
  // bytes (a 224-pixel output's taps are 4.5-8 KB for crop sides up to ~670 pixels, so
  // ImageNet's crop sides all fit) an entry is dropped before the two lookups, never between
  // them: both references must stay valid. An entry is added only once computed, so a
  // bad_alloc there leaves no empty taps behind.
  constexpr size_t kCached = size_t{4} << 20;
  thread_local std::unordered_map<uint64_t, AntialiasTaps> cache;
  thread_local size_t cached = 0;
  auto bytes = [](const AntialiasTaps& t) {
    return (t.first.size() + t.count.size()) * sizeof(int) + t.weights.size() * sizeof(float);
  };
  while (cached > kCached && !cache.empty()) {
    cached -= bytes(cache.begin()->second);
    cache.erase(cache.begin());
  }
  auto taps = [&](int in, int out) -> const AntialiasTaps& {
    const uint64_t key = uint64_t{static_cast<uint32_t>(in)} << 32 | static_cast<uint32_t>(out);
    auto it = cache.find(key);
    if (it == cache.end()) {
      it = cache.emplace(key, ComputeAntialiasTaps(in, out)).first;
      cached += bytes(it->second);
    }
    return it->second;
  };
  const AntialiasTaps& horizontal = taps(in_w, spec.out_w);
  const AntialiasTaps& vertical = taps(in_h, spec.out_h);
#if defined(__x86_64__)
  if (!spec.portable && HasAvx2Fma() && spec.out_w % 8 == 0) {
    ResampleBlocksAvx2(pixels, row_stride, channels, in_h, in_w, horizontal, vertical, spec, out);
    return;
  }
  if (!spec.portable && HasAvx2Fma()) {
    ResampleAvx2(pixels, row_stride, channels, in_w, horizontal, vertical, spec, out);
    return;
  }
#endif
  ResamplePortable(pixels, row_stride, channels, in_w, horizontal, vertical, spec, out);
}

}  // namespace dtrain

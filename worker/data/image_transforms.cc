#include "worker/data/image_transforms.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/data/antialias_resample.h"
#include "worker/data/pixel_normalize.h"

namespace dtrain {
namespace {

using v1::ImageTransform;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Python's round(): half to even (the default floating-point rounding mode), then int().
int RoundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

// [h, w] from torchvision's size argument: [s] means s x s.
std::vector<int> HeightWidth(const google::protobuf::RepeatedField<int32_t>& size) {
  if (size.size() == 1) return {size[0], size[0]};
  return {size[0], size[1]};
}

absl::Status CheckSize(const google::protobuf::RepeatedField<int32_t>& size,
                       const std::string& where) {
  if (size.size() != 1 && size.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".size: give [s] or [h, w], not ", size.size(), " values"));
  }
  for (int i = 0; i < size.size(); ++i) {
    if (size[i] <= 0 || size[i] > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".size[", i, "] must be in [1, 65536], not ", size[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const google::protobuf::RepeatedField<float>& range,
                        const std::string& where) {
  if (range.empty()) return absl::OkStatus();
  if (range.size() != 2 || !(range[0] > 0) || !(range[0] <= range[1]) || !std::isfinite(range[1])) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " must be [min, max] with 0 < min <= max, not [", absl::StrJoin(range, ", "), "]"));
  }
  return absl::OkStatus();
}

bool Antialias(ImageTransform::Interpolation interpolation, bool has, bool value) {
  if (interpolation == ImageTransform::INTERPOLATION_NEAREST) return false;
  return has ? value : true;
}

// The pixels as a uint8 CHW view (no copy: `image` must outlive it).
at::Tensor ChwView(DecodedImage& image) {
  return at::from_blob(image.pixels.data(), {image.height, image.width, image.channels},
                       at::TensorOptions().dtype(at::kByte))
      .permute({2, 0, 1});
}

// F_t._blend: the blend is computed in float (a Python float times a uint8 tensor is float32),
// clamped, and truncated back to uint8 by .to(), as torchvision does (no rounding).
at::Tensor Blend(const at::Tensor& image1, const at::Tensor& image2, double ratio) {
  const double bound = image1.is_floating_point() ? 1.0 : 255.0;
  return at::add(at::mul(image1, ratio), at::mul(image2, 1.0 - ratio))
      .clamp(0, bound)
      .to(image1.scalar_type());
}

// F_t.rgb_to_grayscale(num_output_channels=1).
at::Tensor Grayscale(const at::Tensor& image) {
  if (image.size(-3) != 3) return image.clone();
  std::vector<at::Tensor> rgb = image.unbind(-3);
  return at::add(at::add(at::mul(rgb[0], 0.2989), at::mul(rgb[1], 0.587)), at::mul(rgb[2], 0.114))
      .to(image.scalar_type())
      .unsqueeze(-3);
}

at::Tensor RgbToHsv(const at::Tensor& image) {
  std::vector<at::Tensor> rgb = image.unbind(-3);
  const at::Tensor& r = rgb[0];
  const at::Tensor& g = rgb[1];
  const at::Tensor& b = rgb[2];
  at::Tensor maxc = std::get<0>(at::max(image, -3));
  at::Tensor minc = std::get<0>(at::min(image, -3));
  at::Tensor eqc = at::eq(maxc, minc);
  at::Tensor cr = at::sub(maxc, minc);
  at::Tensor ones = at::ones_like(maxc);
  at::Tensor s = at::div(cr, at::where(eqc, ones, maxc));
  at::Tensor cr_divisor = at::where(eqc, ones, cr);
  at::Tensor rc = at::div(at::sub(maxc, r), cr_divisor);
  at::Tensor gc = at::div(at::sub(maxc, g), cr_divisor);
  at::Tensor bc = at::div(at::sub(maxc, b), cr_divisor);
  at::Tensor hr = at::mul(at::eq(maxc, r), at::sub(bc, gc));
  at::Tensor hg =
      at::mul(at::logical_and(at::eq(maxc, g), at::ne(maxc, r)), at::sub(at::add(rc, 2.0), bc));
  at::Tensor hb =
      at::mul(at::logical_and(at::ne(maxc, g), at::ne(maxc, r)), at::sub(at::add(gc, 4.0), rc));
  at::Tensor h = at::add(at::add(hr, hg), hb);
  h = at::fmod(at::add(at::div(h, 6.0), 1.0), 1.0);
  return at::stack({h, s, maxc}, -3);
}

at::Tensor HsvToRgb(const at::Tensor& image) {
  std::vector<at::Tensor> hsv = image.unbind(-3);
  const at::Tensor& h = hsv[0];
  const at::Tensor& s = hsv[1];
  const at::Tensor& v = hsv[2];
  at::Tensor i = at::floor(at::mul(h, 6.0));
  at::Tensor f = at::sub(at::mul(h, 6.0), i);
  i = i.to(at::kInt);
  at::Tensor p = at::clamp(at::mul(v, at::rsub(s, 1.0)), 0.0, 1.0);
  at::Tensor q = at::clamp(at::mul(v, at::rsub(at::mul(s, f), 1.0)), 0.0, 1.0);
  at::Tensor t = at::clamp(at::mul(v, at::rsub(at::mul(s, at::rsub(f, 1.0)), 1.0)), 0.0, 1.0);
  i = at::remainder(i, 6);
  at::Tensor mask = at::eq(i.unsqueeze(-3), at::arange(6, i.options()).view({-1, 1, 1}));
  at::Tensor a1 = at::stack({v, q, p, p, t, v}, -3);
  at::Tensor a2 = at::stack({t, v, v, q, p, p}, -3);
  at::Tensor a3 = at::stack({p, p, t, v, v, q}, -3);
  at::Tensor a4 = at::stack({a1, a2, a3}, -4);
  return at::einsum("...ijk, ...xijk -> ...xjk", {mask.to(image.scalar_type()), a4});
}

std::string Where(absl::string_view where, int index, const char* name) {
  return absl::StrCat(where, "[", index, "].", name);
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

namespace image_ops {

at::Tensor Resize(const at::Tensor& image, int height, int width,
                  ImageTransform::Interpolation interpolation, bool antialias) {
  // F_t.resize: NCHW in float, interpolate, round and cast back for an integer image.
  if (image.size(-2) == height && image.size(-1) == width) return image;  // as F.resize
  const at::ScalarType dtype = image.scalar_type();
  const bool cast = dtype != at::kFloat && dtype != at::kDouble;
  at::Tensor x = image.unsqueeze(0);
  if (cast) x = x.to(at::kFloat);
  const std::vector<int64_t> size = {height, width};
  switch (interpolation) {
    case ImageTransform::INTERPOLATION_NEAREST:
      x = at::upsample_nearest2d(x, size, c10::nullopt, c10::nullopt);
      break;
    case ImageTransform::INTERPOLATION_BICUBIC:
      x = antialias ? at::_upsample_bicubic2d_aa(x, size, false, c10::nullopt, c10::nullopt)
                    : at::upsample_bicubic2d(x, size, false, c10::nullopt, c10::nullopt);
      if (dtype == at::kByte) x = x.clamp(0, 255);
      break;
    default:
      x = antialias ? at::_upsample_bilinear2d_aa(x, size, false, c10::nullopt, c10::nullopt)
                    : at::upsample_bilinear2d(x, size, false, c10::nullopt, c10::nullopt);
      break;
  }
  x = x.squeeze(0);
  if (cast) x = at::round(x).to(dtype);
  return x;
}

at::Tensor Pad(const at::Tensor& image, int left, int top, int right, int bottom, double fill,
               ImageTransform::PaddingMode mode) {
  if (mode == ImageTransform::PADDING_MODE_CONSTANT) {
    return at::constant_pad_nd(image, {left, right, top, bottom}, fill);
  }
  // Reflection and replication pads have no integer kernels: torchvision pads in float.
  const at::ScalarType dtype = image.scalar_type();
  at::Tensor x = image.unsqueeze(0);
  if (dtype != at::kFloat && dtype != at::kDouble) x = x.to(at::kFloat);
  x = mode == ImageTransform::PADDING_MODE_EDGE
          ? at::replication_pad2d(x, {left, right, top, bottom})
          : at::reflection_pad2d(x, {left, right, top, bottom});
  return x.squeeze(0).to(dtype);
}

at::Tensor Crop(const at::Tensor& image, int top, int left, int height, int width) {
  const int h = static_cast<int>(image.size(-2));
  const int w = static_cast<int>(image.size(-1));
  const int right = left + width;
  const int bottom = top + height;
  if (left < 0 || top < 0 || right > w || bottom > h) {
    const int pad_left = std::max(-left + std::min(0, right), 0);
    const int pad_top = std::max(-top + std::min(0, bottom), 0);
    const int pad_right = std::max(right - std::max(w, left), 0);
    const int pad_bottom = std::max(bottom - std::max(h, top), 0);
    at::Tensor inside =
        image.slice(-2, std::max(top, 0), bottom).slice(-1, std::max(left, 0), right);
    return at::constant_pad_nd(inside, {pad_left, pad_right, pad_top, pad_bottom}, 0);
  }
  return image.slice(-2, top, bottom).slice(-1, left, right);
}

at::Tensor CenterCrop(const at::Tensor& image, int height, int width) {
  at::Tensor x = image;
  int h = static_cast<int>(x.size(-2));
  int w = static_cast<int>(x.size(-1));
  if (width > w || height > h) {
    const int pad_left = width > w ? (width - w) / 2 : 0;
    const int pad_top = height > h ? (height - h) / 2 : 0;
    const int pad_right = width > w ? (width - w + 1) / 2 : 0;
    const int pad_bottom = height > h ? (height - h + 1) / 2 : 0;
    x = at::constant_pad_nd(x, {pad_left, pad_right, pad_top, pad_bottom}, 0);
    h = static_cast<int>(x.size(-2));
    w = static_cast<int>(x.size(-1));
    if (width == w && height == h) return x;
  }
  const int top = RoundHalfEven((h - height) / 2.0);
  const int left = RoundHalfEven((w - width) / 2.0);
  return Crop(x, top, left, height, width);
}

at::Tensor HorizontalFlip(const at::Tensor& image) { return image.flip({-1}); }

at::Tensor AdjustBrightness(const at::Tensor& image, double factor) {
  return Blend(image, at::zeros_like(image), factor);
}

at::Tensor AdjustContrast(const at::Tensor& image, double factor) {
  const at::ScalarType dtype = image.is_floating_point() ? image.scalar_type() : at::kFloat;
  at::Tensor gray = image.size(-3) == 3 ? Grayscale(image) : image;
  at::Tensor mean = at::mean(gray.to(dtype), {-3, -2, -1}, /*keepdim=*/true);
  return Blend(image, mean, factor);
}

at::Tensor AdjustSaturation(const at::Tensor& image, double factor) {
  if (image.size(-3) == 1) return image;
  return Blend(image, Grayscale(image), factor);
}

at::Tensor AdjustHue(const at::Tensor& image, double factor) {
  if (image.size(-3) == 1) return image;
  const at::ScalarType dtype = image.scalar_type();
  at::Tensor x = image;
  if (dtype == at::kByte) x = at::div(x.to(at::kFloat), 255.0);
  x = RgbToHsv(x);
  std::vector<at::Tensor> hsv = x.unbind(-3);
  at::Tensor h = at::remainder(at::add(hsv[0], factor), 1.0);
  x = HsvToRgb(at::stack({h, hsv[1], hsv[2]}, -3));
  if (dtype == at::kByte) x = at::mul(x, 255.0).to(dtype);
  return x;
}

at::Tensor ToFloat(const at::Tensor& image) {
  if (image.is_floating_point()) return image;
  return image.to(at::kFloat).div(255);
}

at::Tensor Normalize(const at::Tensor& image, const std::vector<float>& mean,
                     const std::vector<float>& std) {
  at::Tensor m = at::tensor(mean, at::kFloat).view({-1, 1, 1});
  at::Tensor s = at::tensor(std, at::kFloat).view({-1, 1, 1});
  return at::sub(image, m).div_(s);
}

}  // namespace image_ops

absl::StatusOr<ImageTransformPipeline> ImageTransformPipeline::Create(
    const google::protobuf::RepeatedPtrField<ImageTransform>& transforms, absl::string_view where) {
  ImageTransformPipeline pipeline;
  int to_tensor_at = -1;
  int first_normalize = -1;
  for (int i = 0; i < transforms.size(); ++i) {
    const ImageTransform& t = transforms[i];
    Step step;
    step.transform = t;
    switch (t.kind_case()) {
      case ImageTransform::kResize: {
        const std::string at = Where(where, i, "resize");
        if (absl::Status ok = CheckSize(t.resize().size(), at); !ok.ok()) return ok;
        if (t.resize().has_max_size()) {
          if (t.resize().size().size() != 1) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, ".max_size: only with size [s], not [h, w]"));
          }
          if (t.resize().max_size() <= t.resize().size(0)) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, ".max_size must be greater than size[0] (", t.resize().size(0),
                             "), not ", t.resize().max_size()));
          }
        }
        if (t.resize().interpolation() == ImageTransform::INTERPOLATION_NEAREST &&
            t.resize().has_antialias() && t.resize().antialias()) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ".antialias: only for bilinear and bicubic interpolation"));
        }
        step.size.assign(t.resize().size().begin(), t.resize().size().end());
        break;
      }
      case ImageTransform::kCenterCrop: {
        const std::string at = Where(where, i, "center_crop");
        if (absl::Status ok = CheckSize(t.center_crop().size(), at); !ok.ok()) return ok;
        step.size = HeightWidth(t.center_crop().size());
        break;
      }
      case ImageTransform::kRandomResizedCrop: {
        const auto& rrc = t.random_resized_crop();
        const std::string at = Where(where, i, "random_resized_crop");
        if (absl::Status ok = CheckSize(rrc.size(), at); !ok.ok()) return ok;
        if (absl::Status ok = CheckRange(rrc.scale(), at + ".scale"); !ok.ok()) return ok;
        if (absl::Status ok = CheckRange(rrc.ratio(), at + ".ratio"); !ok.ok()) return ok;
        if (rrc.interpolation() == ImageTransform::INTERPOLATION_NEAREST && rrc.has_antialias() &&
            rrc.antialias()) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ".antialias: only for bilinear and bicubic interpolation"));
        }
        step.size = HeightWidth(rrc.size());
        break;
      }
      case ImageTransform::kRandomCrop: {
        const auto& rc = t.random_crop();
        const std::string at = Where(where, i, "random_crop");
        if (absl::Status ok = CheckSize(rc.size(), at); !ok.ok()) return ok;
        const int n = rc.padding().size();
        if (n != 0 && n != 1 && n != 2 && n != 4) {
          return absl::InvalidArgumentError(absl::StrCat(
              at,
              ".padding: give [all], [left/right, top/bottom] or [left, top, right, bottom], "
              "not ",
              n, " values"));
        }
        for (int k = 0; k < n; ++k) {
          if (rc.padding(k) < 0 || rc.padding(k) > 65536) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, ".padding[", k, "] must be in [0, 65536], not ", rc.padding(k)));
          }
        }
        if (!ImageTransform::PaddingMode_IsValid(rc.padding_mode())) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ".padding_mode: unknown value ", rc.padding_mode()));
        }
        step.size = HeightWidth(rc.size());
        break;
      }
      case ImageTransform::kRandomHorizontalFlip: {
        const auto& flip = t.random_horizontal_flip();
        if (flip.has_p() && !(flip.p() >= 0 && flip.p() <= 1)) {
          return absl::InvalidArgumentError(absl::StrCat(Where(where, i, "random_horizontal_flip"),
                                                         ".p must be in [0, 1], not ", flip.p()));
        }
        break;
      }
      case ImageTransform::kColorJitter: {
        const auto& cj = t.color_jitter();
        const std::string at = Where(where, i, "color_jitter");
        const std::pair<const char*, float> factors[] = {{"brightness", cj.brightness()},
                                                         {"contrast", cj.contrast()},
                                                         {"saturation", cj.saturation()}};
        for (const auto& [name, value] : factors) {
          if (!(value >= 0) || !std::isfinite(value)) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, ".", name, " must be >= 0, not ", value));
          }
        }
        if (!(cj.hue() >= 0 && cj.hue() <= 0.5)) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ".hue must be in [0, 0.5], not ", cj.hue()));
        }
        break;
      }
      case ImageTransform::kNormalize: {
        const auto& n = t.normalize();
        const std::string at = Where(where, i, "normalize");
        if (n.mean().empty() || n.mean().size() != n.std().size()) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ": give mean and std with one value per channel each, not ",
                           n.mean().size(), " and ", n.std().size()));
        }
        for (int k = 0; k < n.std().size(); ++k) {
          if (!(n.std(k) > 0) || !std::isfinite(n.std(k))) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, ": std[", k, "] must be > 0, not ", n.std(k)));
          }
          if (!std::isfinite(n.mean(k))) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, ": mean[", k, "] must be finite, not ", n.mean(k)));
          }
        }
        if (first_normalize < 0) first_normalize = i;
        break;
      }
      case ImageTransform::kToTensor:
        if (to_tensor_at >= 0) {
          return absl::InvalidArgumentError(absl::StrCat(Where(where, i, "to_tensor"),
                                                         ": a second to_tensor (the first is [",
                                                         to_tensor_at, "])"));
        }
        if (first_normalize >= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(where, first_normalize, "normalize"), ": comes before to_tensor (at [", i,
              "]); normalize works on the float tensor"));
        }
        to_tensor_at = i;
        break;
      case ImageTransform::KIND_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat(where, "[", i, "]: no transform set (resize, center_crop, ...)"));
    }
    pipeline.steps_.push_back(std::move(step));
  }
  if (!pipeline.steps_.empty() && pipeline.steps_[0].transform.has_random_resized_crop()) {
    const auto& rrc = pipeline.steps_[0].transform.random_resized_crop();
    pipeline.fused_ = rrc.interpolation() == ImageTransform::INTERPOLATION_BILINEAR &&
                      Antialias(rrc.interpolation(), rrc.has_antialias(), rrc.antialias()) &&
                      to_tensor_at != 0;
    for (size_t i = 1; i < pipeline.steps_.size(); ++i) {
      const ImageTransform& t = pipeline.steps_[i].transform;
      if (!t.has_random_horizontal_flip() && !t.has_to_tensor() && !t.has_normalize()) {
        pipeline.fused_ = false;
      }
    }
  }
  pipeline.pointwise_ = true;
  for (const Step& step : pipeline.steps_) {
    const ImageTransform& t = step.transform;
    if (!t.has_random_horizontal_flip() && !t.has_to_tensor() && !t.has_normalize()) {
      pipeline.pointwise_ = false;
    }
  }
  if (to_tensor_at >= 0) {
    pipeline.to_float_at_ = static_cast<size_t>(to_tensor_at);
  } else if (first_normalize >= 0) {
    pipeline.to_float_at_ = static_cast<size_t>(first_normalize);
  } else {
    pipeline.to_float_at_ = pipeline.steps_.size();
  }
  return pipeline;
}

absl::StatusOr<at::Tensor> ImageTransformPipeline::Run(at::Tensor image, size_t first_step,
                                                       SampleRandom& rng) const {
  try {
    c10::InferenceMode inference;
    at::Tensor x = std::move(image);
    for (size_t i = first_step; i < steps_.size(); ++i) {
      if (i == to_float_at_) x = image_ops::ToFloat(x);
      const ImageTransform& t = steps_[i].transform;
      const std::vector<int>& size = steps_[i].size;
      const int h = static_cast<int>(x.size(-2));
      const int w = static_cast<int>(x.size(-1));
      switch (t.kind_case()) {
        case ImageTransform::kResize: {
          const auto& r = t.resize();
          int out_h = 0;
          int out_w = 0;
          if (size.size() == 2) {
            out_h = size[0];
            out_w = size[1];
          } else {  // functional._compute_resized_output_size
            const int shorter = std::min(h, w);
            const int longer = std::max(h, w);
            int new_short = size[0];
            int new_long = static_cast<int>(static_cast<double>(size[0]) * longer / shorter);
            if (r.has_max_size() && new_long > r.max_size()) {
              new_short =
                  static_cast<int>(static_cast<double>(r.max_size()) * new_short / new_long);
              new_long = r.max_size();
            }
            out_w = w <= h ? new_short : new_long;
            out_h = w <= h ? new_long : new_short;
          }
          if (out_h != h || out_w != w) {
            x = image_ops::Resize(x, out_h, out_w, r.interpolation(),
                                  Antialias(r.interpolation(), r.has_antialias(), r.antialias()));
          }
          break;
        }
        case ImageTransform::kCenterCrop:
          x = image_ops::CenterCrop(x, size[0], size[1]);
          break;
        case ImageTransform::kRandomResizedCrop: {
          const auto& rrc = t.random_resized_crop();
          const bool default_scale = rrc.scale().empty();
          const bool default_ratio = rrc.ratio().empty();
          CropBox box = RandomResizedCropParams(h, w, default_scale ? 0.08 : rrc.scale(0),
                                                default_scale ? 1.0 : rrc.scale(1),
                                                default_ratio ? 3.0 / 4.0 : rrc.ratio(0),
                                                default_ratio ? 4.0 / 3.0 : rrc.ratio(1), rng);
          x = image_ops::Resize(
              image_ops::Crop(x, box.top, box.left, box.height, box.width), size[0], size[1],
              rrc.interpolation(),
              Antialias(rrc.interpolation(), rrc.has_antialias(), rrc.antialias()));
          break;
        }
        case ImageTransform::kRandomCrop: {
          const auto& rc = t.random_crop();
          const auto& p = rc.padding();
          if (!p.empty()) {
            // [all], [left/right, top/bottom], [left, top, right, bottom]
            const int left = p[0];
            const int top = p.size() == 1 ? p[0] : p[1];
            const int right = p.size() == 4 ? p[2] : left;
            const int bottom = p.size() == 4 ? p[3] : top;
            x = image_ops::Pad(x, left, top, right, bottom, rc.fill(), rc.padding_mode());
          }
          int ph = static_cast<int>(x.size(-2));
          int pw = static_cast<int>(x.size(-1));
          if (rc.pad_if_needed() && pw < size[1]) {
            const int d = size[1] - pw;
            x = image_ops::Pad(x, d, 0, d, 0, rc.fill(), rc.padding_mode());
          }
          if (rc.pad_if_needed() && ph < size[0]) {
            const int d = size[0] - ph;
            x = image_ops::Pad(x, 0, d, 0, d, rc.fill(), rc.padding_mode());
          }
          ph = static_cast<int>(x.size(-2));
          pw = static_cast<int>(x.size(-1));
          if (ph < size[0] || pw < size[1]) {
            return absl::InvalidArgumentError(absl::StrCat(
                "random_crop: the crop ", size[0], "x", size[1], " (h x w) is larger than the ", ph,
                "x", pw, " image after padding; set pad_if_needed"));
          }
          if (ph != size[0] || pw != size[1]) {
            const int top = static_cast<int>(rng.UniformInt(0, ph - size[0]));
            const int left = static_cast<int>(rng.UniformInt(0, pw - size[1]));
            x = image_ops::Crop(x, top, left, size[0], size[1]);
          }
          break;
        }
        case ImageTransform::kRandomHorizontalFlip: {
          const double p =
              t.random_horizontal_flip().has_p() ? t.random_horizontal_flip().p() : 0.5;
          if (rng.Uniform(0, 1) < p) x = image_ops::HorizontalFlip(x);
          break;
        }
        case ImageTransform::kColorJitter: {
          const auto& cj = t.color_jitter();
          const ColorJitterParams p = DrawColorJitterParams(cj, rng);
          for (int op : p.order) {
            if (op == 0 && p.brightness >= 0) x = image_ops::AdjustBrightness(x, p.brightness);
            if (op == 1 && p.contrast >= 0) x = image_ops::AdjustContrast(x, p.contrast);
            if (op == 2 && p.saturation >= 0) x = image_ops::AdjustSaturation(x, p.saturation);
            if (op == 3 && cj.hue() > 0) x = image_ops::AdjustHue(x, p.hue);
          }
          break;
        }
        case ImageTransform::kNormalize: {
          const auto& n = t.normalize();
          const int channels = static_cast<int>(x.size(-3));
          if (n.mean().size() != 1 && n.mean().size() != channels) {
            return absl::InvalidArgumentError(absl::StrCat(
                "normalize: ", n.mean().size(), " means for an image of ", channels, " channels"));
          }
          x = image_ops::Normalize(x, {n.mean().begin(), n.mean().end()},
                                   {n.std().begin(), n.std().end()});
          break;
        }
        case ImageTransform::kToTensor:
        case ImageTransform::KIND_NOT_SET:
          break;
      }
    }
    if (to_float_at_ >= steps_.size()) x = image_ops::ToFloat(x);
    return x.contiguous();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("image transforms: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> ImageTransformPipeline::FusedCropResize(
    const uint8_t* pixels, int64_t row_stride, int channels, const CropBox& box, SampleRandom& rng,
    const ImageOutput& output) const {
  // The random draws in the order the steps make them: the crop box (drawn by the caller),
  // then each flip's.
  bool flip = false;
  std::vector<const ImageTransform::Normalize*> normalizes;
  for (size_t i = 1; i < steps_.size(); ++i) {
    const ImageTransform& t = steps_[i].transform;
    if (t.has_random_horizontal_flip()) {
      const double p = t.random_horizontal_flip().has_p() ? t.random_horizontal_flip().p() : 0.5;
      if (rng.Uniform(0, 1) < p) flip = !flip;
    } else if (t.has_normalize()) {
      const int n = t.normalize().mean().size();
      if (n != 1 && n != channels) {
        return absl::InvalidArgumentError(
            absl::StrCat("normalize: ", n, " means for an image of ", channels, " channels"));
      }
      normalizes.push_back(&t.normalize());
    }
  }
  CropResizeSpec spec;
  spec.out_h = steps_[0].size[0];
  spec.out_w = steps_[0].size[1];
  spec.flip = flip;
  for (const ImageTransform::Normalize* n : normalizes) {
    for (int c = 0; c < channels; ++c) {
      const int k = n->mean().size() == 1 ? 0 : c;
      spec.means.push_back(n->mean(k));
      spec.stds.push_back(n->std(k));
    }
  }
  at::Tensor out;
  if (output) out = output({channels, spec.out_h, spec.out_w});
  if (!out.defined() || out.scalar_type() != at::kFloat || !out.is_contiguous() ||
      !out.sizes().equals({channels, spec.out_h, spec.out_w})) {
    out = at::empty({channels, spec.out_h, spec.out_w}, at::kFloat);
  }
  CropResizeNormalize(pixels + int64_t{box.top} * row_stride + int64_t{box.left} * channels,
                      row_stride, channels, box.height, box.width, spec, out.data_ptr<float>());
  return out;
}

absl::StatusOr<at::Tensor> ImageTransformPipeline::PointwiseApply(const DecodedImage& image,
                                                                  SampleRandom& rng,
                                                                  const ImageOutput& output) const {
  PixelNormalizeSpec spec;
  for (const Step& step : steps_) {  // the random draws in the order the steps make them
    const ImageTransform& t = step.transform;
    if (t.has_random_horizontal_flip()) {
      const double p = t.random_horizontal_flip().has_p() ? t.random_horizontal_flip().p() : 0.5;
      if (rng.Uniform(0, 1) < p) spec.flip = !spec.flip;
    } else if (t.has_normalize()) {
      const int n = t.normalize().mean().size();
      if (n != 1 && n != image.channels) {
        return absl::InvalidArgumentError(
            absl::StrCat("normalize: ", n, " means for an image of ", image.channels, " channels"));
      }
      for (int c = 0; c < image.channels; ++c) {
        const int k = n == 1 ? 0 : c;
        spec.means.push_back(t.normalize().mean(k));
        spec.stds.push_back(t.normalize().std(k));
      }
    }
  }
  try {
    const std::vector<int64_t> sizes{image.channels, image.height, image.width};
    at::Tensor out;
    if (output) out = output(sizes);
    if (!out.defined() || out.scalar_type() != at::kFloat || !out.is_contiguous() ||
        !out.sizes().equals(sizes)) {
      out = at::empty(sizes, at::kFloat);
    }
    PixelNormalize(image.pixels.data(), image.height, image.width, image.channels, spec,
                   out.data_ptr<float>());
    return out;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("image transforms: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> ImageTransformPipeline::Apply(DecodedImage image, SampleRandom& rng,
                                                         const ImageOutput& output) const {
  if (image.channels != 1 && image.channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("image transforms: images have 1 or 3 channels, not ", image.channels));
  }
  if (fused_) {
    const auto& rrc = steps_[0].transform.random_resized_crop();
    const bool default_scale = rrc.scale().empty();
    const bool default_ratio = rrc.ratio().empty();
    const CropBox box = RandomResizedCropParams(
        image.height, image.width, default_scale ? 0.08 : rrc.scale(0),
        default_scale ? 1.0 : rrc.scale(1), default_ratio ? 3.0 / 4.0 : rrc.ratio(0),
        default_ratio ? 4.0 / 3.0 : rrc.ratio(1), rng);
    return FusedCropResize(image.pixels.data(), int64_t{image.width} * image.channels,
                           image.channels, box, rng, output);
  }
  if (pointwise_) return PointwiseApply(image, rng, output);
  // The view borrows image.pixels; every path through Run copies (at the latest, to float).
  return Run(ChwView(image), 0, rng);
}

absl::StatusOr<at::Tensor> ImageTransformPipeline::DecodeAndApply(absl::string_view encoded,
                                                                  const ImageDecodeOptions& options,
                                                                  SampleRandom& rng,
                                                                  const ImageOutput& output) const {
  // Fused only while the image is still uint8 (a crop then resize in float would round
  // differently).
  const bool crops_first =
      !steps_.empty() && to_float_at_ > 0 &&
      (steps_[0].transform.has_random_resized_crop() || steps_[0].transform.has_center_crop());
  if (!crops_first) {
    absl::StatusOr<DecodedImage> image = DecodeImage(encoded, options);
    if (!image.ok()) return image.status();
    return Apply(*std::move(image), rng, output);
  }
  absl::StatusOr<ImageHeader> header = ReadImageHeader(encoded, options.limits);
  if (!header.ok()) return header.status();
  const Step& first = steps_[0];
  CropWindow window;
  if (first.transform.has_center_crop()) {
    const int ch = first.size[0];
    const int cw = first.size[1];
    if (ch > header->height || cw > header->width) {  // padded: decode it all
      absl::StatusOr<DecodedImage> image = DecodeImage(encoded, options);
      if (!image.ok()) return image.status();
      return Apply(*std::move(image), rng);
    }
    window = {RoundHalfEven((header->height - ch) / 2.0), RoundHalfEven((header->width - cw) / 2.0),
              ch, cw};
  } else {
    const auto& rrc = first.transform.random_resized_crop();
    const bool default_scale = rrc.scale().empty();
    const bool default_ratio = rrc.ratio().empty();
    CropBox box = RandomResizedCropParams(
        header->height, header->width, default_scale ? 0.08 : rrc.scale(0),
        default_scale ? 1.0 : rrc.scale(1), default_ratio ? 3.0 / 4.0 : rrc.ratio(0),
        default_ratio ? 4.0 / 3.0 : rrc.ratio(1), rng);
    window = {box.top, box.left, box.height, box.width};
  }
  absl::StatusOr<DecodedImage> part = DecodeImageWindow(encoded, window, options);
  if (!part.ok()) return part.status();
  if (fused_) {
    return FusedCropResize(part->pixels.data(), int64_t{part->width} * part->channels,
                           part->channels, CropBox{0, 0, part->height, part->width}, rng, output);
  }
  if (first.transform.has_center_crop()) return Run(ChwView(*part), 1, rng);
  try {
    c10::InferenceMode inference;
    const auto& rrc = first.transform.random_resized_crop();
    at::Tensor resized =
        image_ops::Resize(ChwView(*part), first.size[0], first.size[1], rrc.interpolation(),
                          Antialias(rrc.interpolation(), rrc.has_antialias(), rrc.antialias()));
    return Run(std::move(resized), 1, rng);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("image transforms: ", e.what_without_backtrace()));
  }
}

}  // namespace dtrain

#include "worker/data/image_ops.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "worker/data/round_half_even.h"

namespace dtrain {
namespace {

using v1::ImageTransform;

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

}  // namespace

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

}  // namespace dtrain

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
#include "worker/data/round_half_even.h"

namespace dtrain {
namespace {

using v1::ImageTransform;

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

std::string Where(absl::string_view where, int index, const char* name) {
  return absl::StrCat(where, "[", index, "].", name);
}

}  // namespace

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
  const Step& first = steps_[0];
  if (fused_ && first.transform.has_random_resized_crop()) {
    // The training hot path: the header read once, the window decoded into this thread's
    // scratch and resized from there, so once the scratch has grown to the thread's largest
    // window no pixel buffer is allocated, zeroed or copied.
    thread_local std::vector<uint8_t> scratch;
    const auto& rrc = first.transform.random_resized_crop();
    const bool default_scale = rrc.scale().empty();
    const bool default_ratio = rrc.ratio().empty();
    absl::StatusOr<ImageWindowView> part = DecodeChosenWindow(
        encoded, options,
        [&](const ImageHeader& header) {
          const CropBox box = RandomResizedCropParams(
              header.height, header.width, default_scale ? 0.08 : rrc.scale(0),
              default_scale ? 1.0 : rrc.scale(1), default_ratio ? 3.0 / 4.0 : rrc.ratio(0),
              default_ratio ? 4.0 / 3.0 : rrc.ratio(1), rng);
          return CropWindow{box.top, box.left, box.height, box.width};
        },
        scratch);
    absl::StatusOr<at::Tensor> out =
        part.ok() ? FusedCropResize(part->pixels, part->row_stride, part->channels,
                                    CropBox{0, 0, part->height, part->width}, rng, output)
                  : absl::StatusOr<at::Tensor>(part.status());
    // A rare huge image leaves no huge buffer behind on the thread.
    constexpr size_t kKeptScratchBytes = size_t{16} << 20;
    if (scratch.capacity() > kKeptScratchBytes) std::vector<uint8_t>().swap(scratch);
    return out;
  }
  absl::StatusOr<ImageHeader> header = ReadImageHeader(encoded, options.limits);
  if (!header.ok()) return header.status();
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

// torchvision's image transforms on the worker: a job's list of ImageTransform
// (proto/dtrain/v1/transforms.proto) validated once into an ImageTransformPipeline, then applied
// to each decoded image, giving the float32 CHW tensor a torchvision Compose ending in ToTensor
// (and Normalize) gives. Each transform computes what torchvision 0.14's tensor path computes on
// a uint8 CHW tensor, with the same ATen operators (resize: aten::_upsample_bilinear2d_aa on
// float, rounded back to uint8), so deterministic transforms equal torchvision's to the bit; the
// random ones draw their parameters from the same distributions, from a SampleRandom seeded by
// (seed, epoch, sample key) so that a resumed job sees the same augmentations.
//
// Thread-safety: a pipeline is immutable after Create; Apply may run on many threads at once,
// each with its own SampleRandom. The ATen operators parallelise over ATen's intra-op threads:
// a pool of decode threads should run with at::set_num_threads(1) (as the bench does), or the
// threads oversubscribe the cores.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtrain/v1/transforms.pb.h"
#include "worker/data/image_decode.h"

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

// torchvision.transforms.functional's tensor ops on a CHW tensor (uint8 or float32), each as
// torchvision 0.14 computes it, for tests and for callers that compose their own.
namespace image_ops {
// F.resize to exactly [height, width]; bilinear unless nearest/bicubic.
at::Tensor Resize(const at::Tensor& image, int height, int width,
                  v1::ImageTransform::Interpolation interpolation, bool antialias);
// F.pad with [left, top, right, bottom].
at::Tensor Pad(const at::Tensor& image, int left, int top, int right, int bottom, double fill,
               v1::ImageTransform::PaddingMode mode);
// F.crop (pads with 0 where the box leaves the image).
at::Tensor Crop(const at::Tensor& image, int top, int left, int height, int width);
at::Tensor CenterCrop(const at::Tensor& image, int height, int width);
at::Tensor HorizontalFlip(const at::Tensor& image);
at::Tensor AdjustBrightness(const at::Tensor& image, double factor);
at::Tensor AdjustContrast(const at::Tensor& image, double factor);
at::Tensor AdjustSaturation(const at::Tensor& image, double factor);
at::Tensor AdjustHue(const at::Tensor& image, double factor);  // factor in [-0.5, 0.5]
// ToTensor on a uint8 CHW tensor: float32 / 255.
at::Tensor ToFloat(const at::Tensor& image);
at::Tensor Normalize(const at::Tensor& image, const std::vector<float>& mean,
                     const std::vector<float>& std);
}  // namespace image_ops

// Where a transform pipeline may write its float32 result of the given CHW shape: a row of the
// batch being collated, so that the batch needs no copy. Returns an undefined tensor to decline
// (the pipeline then allocates its own).
using ImageOutput = std::function<at::Tensor(at::IntArrayRef sizes)>;

class ImageTransformPipeline {
 public:
  // Validates every transform. INVALID_ARGUMENT naming the position and the field, with `where`
  // as the list's name: "transforms.train[2].normalize: std[1] must be > 0, not 0".
  static absl::StatusOr<ImageTransformPipeline> Create(
      const google::protobuf::RepeatedPtrField<v1::ImageTransform>& transforms,
      absl::string_view where = "transforms");

  // The float32 CHW tensor of `image` (1 or 3 channels) after every transform. INVALID_ARGUMENT
  // when a transform cannot apply to this image (a RandomCrop larger than the padded image, a
  // Normalize with 3 means on a 1-channel image); never throws.
  // Lists that run as one pass over the pixels write into `output`'s tensor when it gives one.
  absl::StatusOr<at::Tensor> Apply(DecodedImage image, SampleRandom& rng,
                                   const ImageOutput& output = {}) const;

  // Decodes `encoded` and applies the transforms, equal to Apply(DecodeImage(encoded), rng) with
  // the same rng. When the first transform crops (RandomResizedCrop, or a CenterCrop inside the
  // image), only the crop window is decoded (DecodeImageWindow). INVALID_ARGUMENT as
  // DecodeImage and Apply. The fused path writes into `output`'s tensor when it gives one;
  // others return their own.
  absl::StatusOr<at::Tensor> DecodeAndApply(absl::string_view encoded,
                                            const ImageDecodeOptions& options, SampleRandom& rng,
                                            const ImageOutput& output = {}) const;

  int size() const { return static_cast<int>(steps_.size()); }

 private:
  struct Step {
    v1::ImageTransform transform;
    std::vector<int> size;  // [h, w] after expanding [s], or [s] for Resize's smaller edge
  };
  absl::StatusOr<at::Tensor> Run(at::Tensor image, size_t first_step, SampleRandom& rng) const;
  // The common training list (RandomResizedCrop, bilinear with antialias, then only flips,
  // to_tensor and normalizes) in one pass over the crop: the same arithmetic as the ATen
  // operators in the same order, without their intermediate tensors.
  absl::StatusOr<at::Tensor> FusedCropResize(const uint8_t* pixels, int64_t row_stride,
                                             int channels, const CropBox& box, SampleRandom& rng,
                                             const ImageOutput& output = {}) const;

  // Only flips, to_tensor and normalizes: one pass (pixel_normalize.h), the same floats as the
  // ATen ops.
  absl::StatusOr<at::Tensor> PointwiseApply(const DecodedImage& image, SampleRandom& rng,
                                            const ImageOutput& output) const;

  bool fused_ = false;
  bool pointwise_ = false;

  std::vector<Step> steps_;
  // The index at which uint8 becomes float (ToTensor's position), steps_.size() for "at the end".
  size_t to_float_at_ = 0;
};

}  // namespace dtrain

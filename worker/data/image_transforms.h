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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtrain/v1/transforms.pb.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_ops.h"
#include "worker/data/sample_random.h"

namespace dtrain {

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

// torchvision.transforms.functional's tensor ops on a CHW tensor (uint8 or float32), each as
// torchvision 0.14 computes it, with the same ATen operators, so that a transform built on them
// equals torchvision's to the bit. For ImageTransformPipeline, tests, and callers that compose
// their own.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "dtrain/v1/transforms.pb.h"

namespace dtrain {

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

}  // namespace dtrain

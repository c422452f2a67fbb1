// Image decoding for the data pipeline: JPEG (libjpeg-turbo), PNG (libpng, or libdeflate for a
// plain PNG: worker/data/plain_png.h) and WebP (libwebp) bytes to 8-bit HWC pixels, the format
// told by its magic bytes, never by a file name. Pixels equal what PIL's
// Image.open(...).convert("RGB") / convert("L") gives, which is what a torchvision ImageFolder
// user trains on. Sizes are checked from the header before any pixel buffer is allocated, so a
// hostile header cannot make the worker allocate gigabytes. Plain C++ (no libtorch).
//
// Thread-safety: every function is reentrant; call them from any number of threads at once.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

enum class ImageFormat { kJpeg, kPng, kWebp };

// "JPEG", "PNG", "WebP": how error messages name a format.
const char* ImageFormatName(ImageFormat format);

struct ImageDecodeLimits {
  int max_width = 32768;
  int max_height = 32768;
  // width * height; the default (128 Mpx) admits any photograph and refuses a decompression bomb.
  int64_t max_pixels = int64_t{128} << 20;
};

struct ImageDecodeOptions {
  // 3: RGB, as PIL's convert("RGB") (alpha dropped, grayscale replicated). 1: grayscale, as
  // PIL's convert("L") (ITU-R 601-2 luma: L = R*299/1000 + G*587/1000 + B*114/1000, rounded).
  int channels = 3;
  ImageDecodeLimits limits;
};

struct DecodedImage {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels bytes, row-major HWC
};

struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  int height = 0;
  int width = 0;
};

// A window of the image in pixels: rows [top, top + height), columns [left, left + width).
struct CropWindow {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// The format and size from the header alone (cheap: no pixel is decoded). INVALID_ARGUMENT
// naming the format and the reason: unknown format (the magic bytes match none of the three),
// corrupt or truncated header, or a size over `limits`.
absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes,
                                            const ImageDecodeLimits& limits = {});

// Decodes the whole image. INVALID_ARGUMENT naming the format and the reason (unknown format,
// corrupt, truncated, too large, unsupported such as a CMYK JPEG, or options.channels not 1/3).
absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes,
                                         const ImageDecodeOptions& options = {});

// Decodes only `window` of the image; the pixels equal DecodeImage's cropped to the window. For
// JPEG only the window's rows and iMCU columns are dequantised, transformed and color-converted
// (libjpeg-turbo's jpeg_crop_scanline and jpeg_skip_scanlines), which is what makes a
// RandomResizedCrop cheaper than a full decode; PNG and WebP decode fully and copy the window.
// INVALID_ARGUMENT as DecodeImage, and for a window that is empty or not inside the image.
absl::StatusOr<DecodedImage> DecodeImageWindow(absl::string_view bytes, const CropWindow& window,
                                               const ImageDecodeOptions& options = {});

// A decoded window in memory its caller owns: `pixels` is its top-left pixel, rows are
// `row_stride` bytes apart, each `width` pixels of `channels` interleaved bytes.
struct ImageWindowView {
  const uint8_t* pixels = nullptr;
  int64_t row_stride = 0;
  int height = 0;
  int width = 0;
  int channels = 0;
};

// DecodeImageWindow for a window that depends on the image's size (RandomResizedCrop's):
// `choose` gets the header and returns the window, so a JPEG's header is parsed once. The
// pixels go to `scratch`, which the caller keeps from call to call (one per thread), so that
// once it is large enough a decode allocates nothing and no pixel is copied: for JPEG the view's
// rows are libjpeg's output rows. The view is valid until `scratch` is used again. `choose`
// must not throw (it runs while libjpeg holds memory). Errors as DecodeImageWindow.
absl::StatusOr<ImageWindowView> DecodeChosenWindow(
    absl::string_view bytes, const ImageDecodeOptions& options,
    absl::FunctionRef<CropWindow(const ImageHeader&)> choose, std::vector<uint8_t>& scratch);

}  // namespace dtrain

// libFuzzer target: image bytes as a shard's .jpg/.png/.webp field brings them
// (worker/data/image_decode.h), decoded whole and through a crop window taken from the input
// (DecodeImageWindow, and DecodeChosenWindow into a scratch of exactly the size it asks for,
// where the sanitizers see any write past it), with a small pixel limit so that the fuzzer explores
// the header checks too. A crash, a sanitizer report, a decode that is OK with the wrong number of
// pixels, or an error other than INVALID_ARGUMENT is a finding. Built and run by tests/fuzz/run.sh
// (needs libjpeg62-turbo-dev, libpng-dev and libwebp-dev).
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/data/image_decode.h"

namespace {

void Check(const absl::StatusOr<dtrain::DecodedImage>& image) {
  if (!image.ok()) {
    if (image.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return;
  }
  if (image->pixels.size() != static_cast<size_t>(image->height) * image->width * image->channels) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  dtrain::ImageDecodeOptions options;
  options.limits.max_pixels = 1 << 20;
  options.limits.max_width = 4096;
  options.limits.max_height = 4096;
  absl::StatusOr<dtrain::ImageHeader> header = dtrain::ReadImageHeader(bytes, options.limits);
  for (int channels : {3, 1}) {
    options.channels = channels;
    Check(dtrain::DecodeImage(bytes, options));
  }
  if (header.ok() && size > 4) {
    // A window from the input's last bytes, so the fuzzer steers it.
    const int w = header->width, h = header->height;
    dtrain::CropWindow window;
    window.top = data[size - 1] % h;
    window.left = data[size - 2] % w;
    window.height = 1 + data[size - 3] % (h - window.top);
    window.width = 1 + data[size - 4] % (w - window.left);
    options.channels = 3;
    absl::StatusOr<dtrain::DecodedImage> part = dtrain::DecodeImageWindow(bytes, window, options);
    Check(part);
    if (part.ok() && (part->height != window.height || part->width != window.width)) std::abort();
    for (int channels : {3, 1}) {
      options.channels = channels;
      std::vector<uint8_t> scratch;
      absl::StatusOr<dtrain::ImageWindowView> view = dtrain::DecodeChosenWindow(
          bytes, options, [&](const dtrain::ImageHeader&) { return window; }, scratch);
      if (!view.ok()) {
        if (view.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
        continue;
      }
      if (view->height != window.height || view->width != window.width ||
          view->channels != channels || view->row_stride < int64_t{view->width} * channels) {
        std::abort();
      }
      // Every byte of the view inside the scratch.
      const uint8_t* end =
          view->pixels + (view->height - 1) * view->row_stride + int64_t{view->width} * channels;
      if (view->pixels < scratch.data() || end > scratch.data() + scratch.size()) std::abort();
    }
  }
  return 0;
}

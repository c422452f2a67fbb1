#include "worker/data/image_decode.h"

// jpeglib.h needs <cstdio> (FILE) first.
// clang-format off
#include <csetjmp>
#include <cstdio>
#include <jerror.h>
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <webp/decode.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/plain_png.h"

namespace dtrain {
namespace {

absl::Status Invalid(ImageFormat format, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(ImageFormatName(format), " image: ", reason));
}

absl::Status CheckSize(ImageFormat format, int64_t width, int64_t height,
                       const ImageDecodeLimits& limits) {
  if (width <= 0 || height <= 0) {
    return Invalid(format, absl::StrCat("corrupt header: size ", width, "x", height));
  }
  if (width > limits.max_width || height > limits.max_height ||
      width * height > limits.max_pixels) {
    return Invalid(format, absl::StrCat("too large: ", width, "x", height, " exceeds the limit of ",
                                        limits.max_width, "x", limits.max_height, " and ",
                                        limits.max_pixels, " pixels"));
  }
  return absl::OkStatus();
}

absl::Status CheckWindow(ImageFormat format, const CropWindow& w, int width, int height) {
  if (w.height <= 0 || w.width <= 0 || w.top < 0 || w.left < 0 ||
      int64_t{w.top} + w.height > height || int64_t{w.left} + w.width > width) {
    return Invalid(format,
                   absl::StrCat("crop window ", w.width, "x", w.height, "+", w.left, "+", w.top,
                                " is not inside the ", width, "x", height, " image"));
  }
  return absl::OkStatus();
}

// PIL's ImagingConvert rgb2l (ITU-R 601-2 luma in 16-bit fixed point), so grayscale equals
// convert("L") to the bit.
inline uint8_t Luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

// Copies `count` pixels of `from_channels` (1 or 3) into `to_channels` (1 or 3).
void ConvertPixels(const uint8_t* from, int from_channels, uint8_t* to, int to_channels,
                   int count) {
  if (from_channels == to_channels) {
    std::memcpy(to, from, static_cast<size_t>(count) * to_channels);
  } else if (from_channels == 1) {
    for (int i = 0; i < count; ++i) to[3 * i] = to[3 * i + 1] = to[3 * i + 2] = from[i];
  } else {
    for (int i = 0; i < count; ++i) to[i] = Luma(from + 3 * i);
  }
}

// Copies `window` out of a decoded HWC buffer of `channels` channels, converting channels.
DecodedImage CopyWindow(const uint8_t* pixels, int width, int channels, const CropWindow& window,
                        int out_channels) {
  DecodedImage out;
  out.height = window.height;
  out.width = window.width;
  out.channels = out_channels;
  out.pixels.resize(static_cast<size_t>(window.height) * window.width * out_channels);
  for (int y = 0; y < window.height; ++y) {
    const uint8_t* row =
        pixels + (static_cast<size_t>(window.top + y) * width + window.left) * channels;
    ConvertPixels(row, channels,
                  out.pixels.data() + static_cast<size_t>(y) * window.width * out_channels,
                  out_channels, window.width);
  }
  return out;
}

// ---- JPEG: libjpeg's error_exit would call exit(); ours longjmps back to the decode call.

struct JpegError {
  jpeg_error_mgr manager;  // first, so a j_common_ptr's err can be cast to JpegError*
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void JpegErrorExit(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, error->message);
  longjmp(error->jump, 1);
}

// libjpeg only warns at a premature end and pads the rest with gray; PIL refuses a truncated
// file (LOAD_TRUNCATED_IMAGES is off by default), and so do we. Other warnings (extraneous bytes
// between markers and the like) PIL ignores, and so do we.
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* error = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(error->message, sizeof(error->message), "truncated (premature end of data)");
    longjmp(error->jump, 1);
  }
  if (level < 0) ++cinfo->err->num_warnings;
}

// Whether libjpeg will smooth blocks: a progressive file whose scans leave some of the low AC
// coefficients unrefined (legal, rare: an encoder's own scan script, or a file cut short
// between scans). Smoothing blends each block with neighbours up to two blocks away, which a
// cropped decode lacks at its edges (measured: the window then differs from a full decode), so
// such a file is decoded at full width from its first row, the safe path for a rare file.
// Known once jpeg_start_decompress has read every scan; true whenever libjpeg might smooth (it
// also requires the DC to be known).
bool BlockSmoothed(const jpeg_decompress_struct& cinfo) {
  if (!cinfo.progressive_mode || !cinfo.do_block_smoothing || cinfo.coef_bits == nullptr) {
    return false;
  }
  for (int c = 0; c < cinfo.num_components; ++c) {
    // libjpeg-turbo's smoothing reads coefficients 1-9 (5x5 neighbourhood); older ones 1-5.
    for (int k = 1; k < 10; ++k) {
      if (cinfo.coef_bits[c][k] != 0) return true;
    }
  }
  return false;
}

// Where JpegDecode puts the window's pixels: contiguous rows in `image` (DecodeImage and
// DecodeImageWindow), or libjpeg's own output rows in `scratch`, described by `view`
// (DecodeChosenWindow). Neither when only the header is wanted.
struct JpegTarget {
  DecodedImage* image = nullptr;
  std::vector<uint8_t>* scratch = nullptr;
  ImageWindowView* view = nullptr;
};

// Everything between setjmp and a longjmp is plain C data or lives in the caller (`target`,
// `header`), so nothing with a destructor is skipped; `choose` returns before libjpeg runs
// again. Returns false with error->message set. The window is `window`, else what `choose`
// makes of the header, else the whole image.
bool JpegDecode(const uint8_t* data, size_t size, const ImageDecodeLimits& limits,
                const CropWindow* window,
                const absl::FunctionRef<CropWindow(const ImageHeader&)>* choose, int out_channels,
                ImageHeader* header, const JpegTarget& target, JpegError* error,
                std::string* failure) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&error->manager);
  error->manager.error_exit = JpegErrorExit;
  error->manager.emit_message = JpegEmitMessage;
  error->message[0] = '\0';
  if (setjmp(error->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  header->format = ImageFormat::kJpeg;
  header->width = static_cast<int>(cinfo.image_width);
  header->height = static_cast<int>(cinfo.image_height);
  if (absl::Status size_ok =
          CheckSize(ImageFormat::kJpeg, cinfo.image_width, cinfo.image_height, limits);
      !size_ok.ok()) {
    *failure = std::string(size_ok.message());
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (target.image == nullptr && target.scratch == nullptr) {  // header only
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    *failure = "JPEG image: CMYK/YCCK color is not supported; convert it to RGB";
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const bool gray_source = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = gray_source ? JCS_GRAYSCALE : JCS_RGB;
  const int decoded_channels = gray_source ? 1 : 3;
  CropWindow w{0, 0, header->height, header->width};
  if (window != nullptr) {
    w = *window;
  } else if (choose != nullptr) {
    w = (*choose)(*header);
  }
  if (absl::Status inside = CheckWindow(ImageFormat::kJpeg, w, header->width, header->height);
      !inside.ok()) {
    *failure = std::string(inside.message());
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_start_decompress(&cinfo);
  const bool smoothed = BlockSmoothed(cinfo);
  // jpeg_crop_scanline widens the window to whole iMCU columns: xoffset moves left, and the rows
  // it returns start there. Its first and last columns are upsampled as if they were the
  // image's edge (fancy upsampling reads one chroma sample to each side), so ask for 2 pixels
  // more on each side and use only the inside. Measured over 189,216 windows (every left edge,
  // widths 1-1000) of 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 and gray images, baseline and
  // progressive: all equal a full decode with 2, 14 differ with 1. 4:1:1 was equal with 2 as
  // well, but its chroma spans 4 pixels, beyond what that reasoning covers, so layouts like it
  // keep a whole iMCU. A smoothed file is not cropped at all.
  const int margin = cinfo.max_h_samp_factor <= 2 ? 2 : cinfo.max_h_samp_factor * DCTSIZE;
  const int crop_left = smoothed ? 0 : std::max(0, w.left - margin);
  const int crop_right =
      smoothed ? header->width : std::min(header->width, w.left + w.width + margin);
  JDIMENSION xoffset = static_cast<JDIMENSION>(crop_left);
  JDIMENSION crop_width = static_cast<JDIMENSION>(crop_right - crop_left);
  if (crop_left != 0 || crop_right != header->width) {
    jpeg_crop_scanline(&cinfo, &xoffset, &crop_width);
  }
  const int shift = w.left - static_cast<int>(xoffset);
  const size_t decoded_stride = static_cast<size_t>(cinfo.output_width) * decoded_channels;
  const size_t decoded_bytes = decoded_stride * w.height;
  const size_t converted =
      decoded_channels == out_channels ? 0 : static_cast<size_t>(w.height) * w.width * out_channels;
  // Sized now that the decoded rows' width is known (a crop's, not the image's); a failed
  // allocation must not leak libjpeg's memory on its way out.
  try {
    if (target.scratch != nullptr) {
      if (target.scratch->size() < decoded_bytes + converted) {
        target.scratch->resize(decoded_bytes + converted);
      }
    } else {
      target.image->pixels.resize(static_cast<size_t>(w.height) * w.width * out_channels);
    }
  } catch (...) {
    jpeg_destroy_decompress(&cinfo);
    throw;
  }
  // Rows libjpeg writes straight into memory of ours, many per call, as TurboJPEG does
  // (measured: one row per call through a scratch row ran at 0.74x of TurboJPEG's speed).
  auto read_rows = [&](JSAMPARRAY rows, int count, int first_row) {
    for (int y = 0; y < count;) {
      const JDIMENSION got =
          jpeg_read_scanlines(&cinfo, rows + y, static_cast<JDIMENSION>(count - y));
      if (got == 0) {
        std::snprintf(error->message, sizeof(error->message), "truncated (no scanline %d)",
                      first_row + y);
        return false;
      }
      y += static_cast<int>(got);
    }
    return true;
  };
  // Where the rows go: the scratch; the output itself when the window is whole decoded rows;
  // else libjpeg's own rows, whose window is copied out.
  DecodedImage* out = target.image;
  const bool direct =
      target.scratch != nullptr || (shift == 0 && static_cast<int>(cinfo.output_width) == w.width &&
                                    decoded_channels == out_channels);
  JSAMPARRAY rows;
  if (direct) {
    rows = static_cast<JSAMPARRAY>((*cinfo.mem->alloc_small)(
        reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE, sizeof(JSAMPROW) * w.height));
    uint8_t* base = target.scratch != nullptr ? target.scratch->data() : out->pixels.data();
    for (int y = 0; y < w.height; ++y) rows[y] = base + y * decoded_stride;
  } else {
    rows = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                      static_cast<JDIMENSION>(decoded_stride),
                                      static_cast<JDIMENSION>(w.height));
  }
  // The rows above the window: skipped (libjpeg decodes of them only what it must), or,
  // smoothed, decoded into the window's rows and overwritten.
  if (w.top > 0 && !smoothed) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(w.top));
  for (int y = 0; smoothed && y < w.top; y += w.height) {
    if (!read_rows(rows, std::min(w.height, w.top - y), y)) {
      jpeg_destroy_decompress(&cinfo);
      return false;
    }
  }
  if (!read_rows(rows, w.height, w.top)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (target.scratch != nullptr) {
    const uint8_t* first = target.scratch->data() + static_cast<size_t>(shift) * decoded_channels;
    *target.view = {first, static_cast<int64_t>(decoded_stride), w.height, w.width, out_channels};
    if (converted != 0) {
      uint8_t* to = target.scratch->data() + decoded_bytes;
      for (int y = 0; y < w.height; ++y) {
        ConvertPixels(first + y * decoded_stride, decoded_channels,
                      to + static_cast<size_t>(y) * w.width * out_channels, out_channels, w.width);
      }
      *target.view = {to, int64_t{w.width} * out_channels, w.height, w.width, out_channels};
    }
  } else if (!direct) {
    for (int y = 0; y < w.height; ++y) {
      ConvertPixels(rows[y] + static_cast<size_t>(shift) * decoded_channels, decoded_channels,
                    out->pixels.data() + static_cast<size_t>(y) * w.width * out_channels,
                    out_channels, w.width);
    }
  }
  if (out != nullptr) {
    out->height = w.height;
    out->width = w.width;
    out->channels = out_channels;
  }
  // Rows below the window are never decoded: abort rather than finish.
  jpeg_destroy_decompress(&cinfo);
  return true;
}

absl::StatusOr<DecodedImage> DecodeJpeg(absl::string_view bytes, const ImageDecodeOptions& options,
                                        const CropWindow* window, ImageHeader* header) {
  JpegError error;
  std::string failure;
  DecodedImage out;
  JpegTarget target;
  target.image = &out;
  if (!JpegDecode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), options.limits,
                  window, nullptr, options.channels, header, target, &error, &failure)) {
    if (!failure.empty()) return absl::InvalidArgumentError(failure);
    return Invalid(ImageFormat::kJpeg, absl::StrCat("corrupt: ", error.message));
  }
  return out;
}

// ---- PNG: libpng's simplified API reports errors in image.message instead of exiting.

absl::Status PngFailure(png_image* image) {
  std::string message = image->message;
  png_image_free(image);
  return Invalid(ImageFormat::kPng, absl::StrCat("corrupt or truncated: ", message));
}

// A plain PNG (worker/data/plain_png.h) decoded without libpng; nullopt when that path declines
// and libpng must read the file.
std::optional<absl::StatusOr<DecodedImage>> DecodePlainPngWindow(absl::string_view bytes,
                                                                 const ImageDecodeOptions& options,
                                                                 const CropWindow* window,
                                                                 ImageHeader* header) {
  PlainPngHeader plain;
  if (!ReadPlainPngHeader(bytes, &plain)) return std::nullopt;
  *header = {ImageFormat::kPng, plain.height, plain.width};
  if (absl::Status size_ok =
          CheckSize(ImageFormat::kPng, plain.width, plain.height, options.limits);
      !size_ok.ok()) {
    return size_ok;
  }
  const CropWindow w = window != nullptr ? *window : CropWindow{0, 0, plain.height, plain.width};
  if (absl::Status inside = CheckWindow(ImageFormat::kPng, w, plain.width, plain.height);
      !inside.ok()) {
    return inside;
  }
  const int channels = plain.color_channels();
  if (window == nullptr && options.channels == channels) {  // straight into the result
    DecodedImage out;
    if (!DecodePlainPng(bytes, plain, &out.pixels)) return std::nullopt;
    out.height = plain.height;
    out.width = plain.width;
    out.channels = channels;
    return out;
  }
  std::vector<uint8_t> decoded;
  if (!DecodePlainPng(bytes, plain, &decoded)) return std::nullopt;
  return CopyWindow(decoded.data(), plain.width, channels, w, options.channels);
}

absl::StatusOr<DecodedImage> DecodePng(absl::string_view bytes, const ImageDecodeOptions& options,
                                       const CropWindow* window, ImageHeader* header) {
  if (std::optional<absl::StatusOr<DecodedImage>> plain =
          DecodePlainPngWindow(bytes, options, window, header)) {
    return *std::move(plain);
  }
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    return PngFailure(&image);
  }
  header->format = ImageFormat::kPng;
  header->width = static_cast<int>(image.width);
  header->height = static_cast<int>(image.height);
  if (absl::Status size_ok =
          CheckSize(ImageFormat::kPng, image.width, image.height, options.limits);
      !size_ok.ok()) {
    png_image_free(&image);
    return size_ok;
  }
  const CropWindow w =
      window != nullptr ? *window : CropWindow{0, 0, header->height, header->width};
  if (absl::Status inside = CheckWindow(ImageFormat::kPng, w, header->width, header->height);
      !inside.ok()) {
    png_image_free(&image);
    return inside;
  }
  // PIL keeps a gray PNG as "L" and a color (or color-palette) one as "RGB"/"RGBA"; converting
  // from those is what convert() does. Alpha is read and dropped, not composited, as PIL does.
  const bool color = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  const int decoded_channels = color ? 3 : 1;
  image.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                       : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  const int stored_channels = decoded_channels + (alpha ? 1 : 0);
  std::vector<uint8_t> decoded(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, decoded.data(), 0, nullptr)) {
    return PngFailure(&image);
  }
  if (alpha) {  // drop alpha in place
    const size_t count = static_cast<size_t>(image.width) * image.height;
    for (size_t i = 0; i < count; ++i) {
      for (int c = 0; c < decoded_channels; ++c) {
        decoded[i * decoded_channels + c] = decoded[i * stored_channels + c];
      }
    }
  }
  return CopyWindow(decoded.data(), header->width, decoded_channels, w, options.channels);
}

// ---- WebP: libwebp returns null on failure; it has no global error state.

absl::StatusOr<DecodedImage> DecodeWebp(absl::string_view bytes, const ImageDecodeOptions& options,
                                        const CropWindow* window, ImageHeader* header,
                                        bool header_only) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  VP8StatusCode code = WebPGetFeatures(data, bytes.size(), &features);
  if (code == VP8_STATUS_NOT_ENOUGH_DATA) return Invalid(ImageFormat::kWebp, "truncated header");
  if (code != VP8_STATUS_OK) {
    return Invalid(ImageFormat::kWebp, absl::StrCat("corrupt header (libwebp status ", code, ")"));
  }
  header->format = ImageFormat::kWebp;
  header->width = features.width;
  header->height = features.height;
  if (absl::Status size_ok =
          CheckSize(ImageFormat::kWebp, features.width, features.height, options.limits);
      !size_ok.ok()) {
    return size_ok;
  }
  if (header_only) return DecodedImage{};
  if (features.has_animation) {
    return Invalid(ImageFormat::kWebp, "animated WebP is not supported");
  }
  const CropWindow w =
      window != nullptr ? *window : CropWindow{0, 0, header->height, header->width};
  if (absl::Status inside = CheckWindow(ImageFormat::kWebp, w, header->width, header->height);
      !inside.ok()) {
    return inside;
  }
  const size_t stride = static_cast<size_t>(features.width) * 3;
  std::vector<uint8_t> decoded(stride * features.height);
  if (WebPDecodeRGBInto(data, bytes.size(), decoded.data(), decoded.size(),
                        static_cast<int>(stride)) == nullptr) {
    return Invalid(ImageFormat::kWebp, "corrupt or truncated data");
  }
  return CopyWindow(decoded.data(), header->width, 3, w, options.channels);
}

absl::StatusOr<ImageFormat> DetectFormat(absl::string_view bytes) {
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8 && static_cast<uint8_t>(bytes[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
  if (bytes.size() >= 8 && bytes.substr(0, 8) == absl::string_view("\x89PNG\r\n\x1a\n", 8)) {
    return ImageFormat::kPng;
  }
  if (bytes.size() >= 12 && bytes.substr(0, 4) == "RIFF" && bytes.substr(8, 4) == "WEBP") {
    return ImageFormat::kWebp;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown image format: the first bytes (", bytes.size(),
                   " in all) are neither JPEG (FF D8 FF), PNG (89 'PNG') nor WebP ('RIFF' ... "
                   "'WEBP')"));
}

// The format of `bytes`, once `options` are known to be valid: what every decode checks first.
absl::StatusOr<ImageFormat> CheckedFormat(absl::string_view bytes,
                                          const ImageDecodeOptions& options) {
  if (options.channels != 1 && options.channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("image decode: channels must be 1 or 3, not ", options.channels));
  }
  return DetectFormat(bytes);
}

absl::StatusOr<DecodedImage> Decode(absl::string_view bytes, const ImageDecodeOptions& options,
                                    const CropWindow* window) {
  absl::StatusOr<ImageFormat> format = CheckedFormat(bytes, options);
  if (!format.ok()) return format.status();
  ImageHeader header;
  switch (*format) {
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, options, window, &header);
    case ImageFormat::kPng:
      return DecodePng(bytes, options, window, &header);
    case ImageFormat::kWebp:
      return DecodeWebp(bytes, options, window, &header, /*header_only=*/false);
  }
  return absl::InternalError("unreachable");
}

}  // namespace

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
  }
  return "unknown";
}

absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes,
                                            const ImageDecodeLimits& limits) {
  absl::StatusOr<ImageFormat> format = DetectFormat(bytes);
  if (!format.ok()) return format.status();
  ImageHeader header;
  ImageDecodeOptions options;
  options.limits = limits;
  switch (*format) {
    case ImageFormat::kJpeg: {
      JpegError error;
      std::string failure;
      if (!JpegDecode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), limits, nullptr,
                      nullptr, 3, &header, JpegTarget{}, &error, &failure)) {
        if (!failure.empty()) return absl::InvalidArgumentError(failure);
        return Invalid(ImageFormat::kJpeg, absl::StrCat("corrupt header: ", error.message));
      }
      return header;
    }
    case ImageFormat::kPng: {
      if (PlainPngHeader plain; ReadPlainPngHeader(bytes, &plain)) {
        header = {ImageFormat::kPng, plain.height, plain.width};
        if (absl::Status size_ok = CheckSize(ImageFormat::kPng, plain.width, plain.height, limits);
            !size_ok.ok()) {
          return size_ok;
        }
        return header;
      }
      png_image image;
      std::memset(&image, 0, sizeof(image));
      image.version = PNG_IMAGE_VERSION;
      if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
        return PngFailure(&image);
      }
      png_image_free(&image);
      header = {ImageFormat::kPng, static_cast<int>(image.height), static_cast<int>(image.width)};
      if (absl::Status size_ok = CheckSize(ImageFormat::kPng, image.width, image.height, limits);
          !size_ok.ok()) {
        return size_ok;
      }
      return header;
    }
    case ImageFormat::kWebp: {
      absl::StatusOr<DecodedImage> none =
          DecodeWebp(bytes, options, nullptr, &header, /*header_only=*/true);
      if (!none.ok()) return none.status();
      return header;
    }
  }
  return absl::InternalError("unreachable");
}

absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes,
                                         const ImageDecodeOptions& options) {
  return Decode(bytes, options, nullptr);
}

absl::StatusOr<DecodedImage> DecodeImageWindow(absl::string_view bytes, const CropWindow& window,
                                               const ImageDecodeOptions& options) {
  return Decode(bytes, options, &window);
}

absl::StatusOr<ImageWindowView> DecodeChosenWindow(
    absl::string_view bytes, const ImageDecodeOptions& options,
    absl::FunctionRef<CropWindow(const ImageHeader&)> choose, std::vector<uint8_t>& scratch) {
  absl::StatusOr<ImageFormat> format = CheckedFormat(bytes, options);
  if (!format.ok()) return format.status();
  ImageHeader header;
  if (*format == ImageFormat::kJpeg) {
    JpegError error;
    std::string failure;
    ImageWindowView view;
    JpegTarget target;
    target.scratch = &scratch;
    target.view = &view;
    if (!JpegDecode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), options.limits,
                    nullptr, &choose, options.channels, &header, target, &error, &failure)) {
      if (!failure.empty()) return absl::InvalidArgumentError(failure);
      return Invalid(ImageFormat::kJpeg, absl::StrCat("corrupt: ", error.message));
    }
    return view;
  }
  // PNG and WebP decode whole images anyway: the header twice costs nothing beside that.
  absl::StatusOr<ImageHeader> read = ReadImageHeader(bytes, options.limits);
  if (!read.ok()) return read.status();
  const CropWindow window = choose(*read);
  absl::StatusOr<DecodedImage> part = Decode(bytes, options, &window);
  if (!part.ok()) return part.status();
  scratch = std::move(part->pixels);
  return ImageWindowView{scratch.data(), int64_t{part->width} * part->channels, part->height,
                         part->width, part->channels};
}

}  // namespace dtrain

// The fast path of PNG decoding: a "plain" PNG (8 bits per sample, gray, gray+alpha, RGB or
// RGBA, not interlaced, with no chunk that changes its pixels) inflated in one call by
// libdeflate and unfiltered here. libpng inflates a row at a time through zlib, which for a
// small image (a 28x28 Fashion-MNIST sample) costs three times the whole-buffer inflate; see
// docs/decisions/models-and-data.md. Everything else, and every error message, stays libpng's:
// when this path says no, its caller asks libpng, which decodes the file or names what is wrong.
// Plain C++ (no libtorch).
//
// Thread-safety: reentrant; each thread keeps its own decompressor and buffers.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace dtrain {

struct PlainPngHeader {
  int width = 0;
  int height = 0;
  int stored_channels = 0;  // 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA
  // What the decode writes per pixel: alpha is dropped (PIL's convert() drops it too).
  int color_channels() const { return stored_channels >= 3 ? 3 : 1; }
};

// True when `bytes` begin with the PNG signature and an intact IHDR chunk (its CRC checked) of a
// plain PNG. Reads nothing past IHDR, so it is as cheap as a header read can be.
bool ReadPlainPngHeader(absl::string_view bytes, PlainPngHeader* header);

// Decodes a PNG whose header ReadPlainPngHeader accepted into `pixels`, height * width *
// color_channels() bytes that the caller allocated after checking the size against its limits.
// False, with `pixels` partly written, for anything it would not decode exactly as libpng's
// simplified API does: a chunk other than IHDR, IDAT, IEND, tEXt, zTXt, iTXt, pHYs and tIME
// (gAMA, sRGB, iCCP, tRNS, PLTE... change pixels in libpng's hands), a CRC mismatch, a corrupt,
// short or long zlib stream, or an unknown row filter.
bool DecodePlainPng(absl::string_view bytes, const PlainPngHeader& header, uint8_t* pixels);

}  // namespace dtrain

// The fast path of PNG decoding: a "plain" PNG (8 bits per sample, gray, gray+alpha, RGB or
// RGBA, not interlaced, with no chunk that changes its pixels) inflated in one call by
// libdeflate and unfiltered here. libpng inflates a row at a time through zlib, and its
// simplified API sets itself up per image: for a small image (a 28x28 Fashion-MNIST sample) that
// costs three times libdeflate's whole-buffer inflate; see docs/decisions/models-and-data.md.
// Everything else, and every error message, stays libpng's: when this path says no, its caller
// asks libpng, which decodes the file or names what is wrong. A known leniency: libdeflate
// decodes some malformed deflate streams that zlib refuses (a precode with a single codeword,
// more than 286 literal/length or 30 distance codes, the reserved symbols 286-287 and 30-31, an
// empty distance code that is used), so such a hostile stream decodes here where libpng would
// fail; its output is still checked against the stream's Adler-32 (by libdeflate). Plain C++ (no
// libtorch).
//
// Thread-safety: reentrant; each thread keeps its own decompressor and buffers.
#pragma once

#include <cstdint>
#include <vector>

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
// plain PNG no side of which is over libpng's limit of 1,000,000. Reads nothing past IHDR.
bool ReadPlainPngHeader(absl::string_view bytes, PlainPngHeader* header);

// Decodes a PNG whose header ReadPlainPngHeader accepted into `pixels`, resized to height x
// width x color_channels() bytes once the chunks have been walked (so a caller checks the size
// against its limits first, and a file that is not plain costs no pixel buffer). False, with
// `pixels` undefined, for anything it would not decode as libpng's simplified API does: a chunk
// other than IHDR, IDAT, IEND, tEXt, pHYs and tIME (gAMA, sRGB, iCCP, tRNS, PLTE... change pixels
// in libpng's hands; zTXt and iTXt are inflated by it), one longer than libpng's stated limits, a
// CRC mismatch, a corrupt, short or long zlib stream or one whose declared window is smaller than
// the image, or an unknown row filter.
bool DecodePlainPng(absl::string_view bytes, const PlainPngHeader& header,
                    std::vector<uint8_t>* pixels);

}  // namespace dtrain

// A plain PNG's chunks walked, its IDAT stream inflated whole by libdeflate and its rows
// unfiltered (PNG specification, section 9: None, Sub, Up, Average, Paeth). Every check that
// fails returns false rather than an error: libpng then reads the same bytes and either decodes
// them (a chunk we leave to it) or says what is wrong, so error messages have one source.
#include "worker/data/plain_png.h"

#include <libdeflate.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace dtrain {
namespace {

constexpr size_t kSignatureBytes = 8;
constexpr size_t kIhdrEnd = kSignatureBytes + 8 + 13 + 4;  // length, type, data, CRC
// A rare huge image leaves no huge buffer behind on the thread.
constexpr size_t kKeptBufferBytes = size_t{16} << 20;

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

bool TypeIs(const uint8_t* type, const char (&name)[5]) { return std::memcmp(type, name, 4) == 0; }

// The chunk's length and type are read, so its CRC (over type and data) can be checked.
bool CrcMatches(const uint8_t* type, uint32_t length) {
  return libdeflate_crc32(0, type, size_t{length} + 4) == BigEndian32(type + 4 + length);
}

// Chunks that carry no pixel meaning for libpng's simplified API. zTXt and iTXt are left out:
// libpng inflates them on read, so a corrupt one is libpng's to judge.
bool IsInertAncillary(const uint8_t* type) {
  return TypeIs(type, "tEXt") || TypeIs(type, "pHYs") || TypeIs(type, "tIME");
}

// The longest chunk other than IDAT in png_check_chunk_length's limits. libpng as Debian builds
// it was measured decoding longer ones anyway; staying inside its stated limits (here and for
// IDAT below) only sends such rare files to libpng.
constexpr uint32_t kLibpngMaxChunkBytes = 8000000;
// ... and a width or height over this (PNG_USER_WIDTH_MAX, PNG_USER_HEIGHT_MAX).
constexpr uint32_t kLibpngMaxSide = 1000000;
// Deflate cannot expand its input more than this (a 258-byte match per 2 bits: 258 x 4).
constexpr size_t kDeflateMaxExpansion = 1032;
static_assert(sizeof(size_t) >= 8, "the size arithmetic below assumes a 64-bit size_t");

// libpng's longest IDAT chunk for this image (png_check_chunk_length): the rows' bytes plus
// zlib's overhead, and never less than its limit for other chunks.
size_t LibpngMaxIdatBytes(size_t width, size_t height, size_t channels) {
  const size_t row_factor = width * channels + 1;
  size_t limit = height * row_factor;
  limit += 6 + 5 * (limit / std::min<size_t>(row_factor, 32566) + 1);
  limit = std::min<size_t>(limit, 0x7fffffffu);
  return std::max<size_t>(limit, kLibpngMaxChunkBytes);
}

struct ThreadBuffers {
  libdeflate_decompressor* inflater = nullptr;
  std::vector<uint8_t> joined;  // the IDAT chunks' data, when there are several
  // Inflated: each row's filter byte, then its bytes. Not a vector: libdeflate writes every byte,
  // so zero-filling it first would be wasted.
  std::unique_ptr<uint8_t[]> rows;
  size_t rows_capacity = 0;
  ThreadBuffers() = default;
  ThreadBuffers(const ThreadBuffers&) = delete;
  ThreadBuffers& operator=(const ThreadBuffers&) = delete;
  ~ThreadBuffers() {
    if (inflater != nullptr) libdeflate_free_decompressor(inflater);
  }
  uint8_t* Rows(size_t bytes) {
    if (rows_capacity < bytes) {
      rows.reset();  // the old buffer goes before the new one comes
      rows.reset(new (std::nothrow) uint8_t[bytes]);
      rows_capacity = rows != nullptr ? bytes : 0;
    }
    return rows.get();
  }
  void Trim() {
    if (joined.capacity() > kKeptBufferBytes) std::vector<uint8_t>().swap(joined);
    if (rows_capacity > kKeptBufferBytes) {
      rows.reset();
      rows_capacity = 0;
    }
  }
};

ThreadBuffers& Buffers() {
  thread_local ThreadBuffers buffers;
  return buffers;
}

uint8_t Paeth(int a, int b, int c) {
  const int pa = b > c ? b - c : c - b;
  const int pb = a > c ? a - c : c - a;
  const int pc = (a + b - 2 * c) >= 0 ? a + b - 2 * c : 2 * c - a - b;
  if (pa <= pb && pa <= pc) return static_cast<uint8_t>(a);
  return static_cast<uint8_t>(pb <= pc ? b : c);
}

// Undoes one row's filter in place; `prev` is the row above, already unfiltered, or null for the
// first row (where "above" is zeros).
bool Unfilter(uint8_t filter, uint8_t* cur, const uint8_t* prev, size_t bytes, size_t bpp) {
  switch (filter) {
    case 0:
      return true;
    case 1:
      for (size_t i = bpp; i < bytes; ++i) cur[i] = static_cast<uint8_t>(cur[i] + cur[i - bpp]);
      return true;
    case 2:
      if (prev != nullptr) {
        for (size_t i = 0; i < bytes; ++i) cur[i] = static_cast<uint8_t>(cur[i] + prev[i]);
      }
      return true;
    case 3:
      if (prev != nullptr) {
        for (size_t i = 0; i < bpp; ++i) cur[i] = static_cast<uint8_t>(cur[i] + (prev[i] >> 1));
        for (size_t i = bpp; i < bytes; ++i) {
          cur[i] = static_cast<uint8_t>(cur[i] + ((cur[i - bpp] + prev[i]) >> 1));
        }
      } else {
        for (size_t i = bpp; i < bytes; ++i) {
          cur[i] = static_cast<uint8_t>(cur[i] + (cur[i - bpp] >> 1));
        }
      }
      return true;
    case 4:
      if (prev != nullptr) {  // left and upper-left are 0 in the first pixel: Paeth picks above
        for (size_t i = 0; i < bpp; ++i) cur[i] = static_cast<uint8_t>(cur[i] + prev[i]);
        for (size_t i = bpp; i < bytes; ++i) {
          cur[i] = static_cast<uint8_t>(cur[i] + Paeth(cur[i - bpp], prev[i], prev[i - bpp]));
        }
      } else {  // above is 0: Paeth picks left
        for (size_t i = bpp; i < bytes; ++i) cur[i] = static_cast<uint8_t>(cur[i] + cur[i - bpp]);
      }
      return true;
    default:
      return false;
  }
}

void DropAlpha(const uint8_t* from, int stored_channels, uint8_t* to, int width) {
  if (stored_channels == 2) {
    for (int x = 0; x < width; ++x) to[x] = from[2 * x];
  } else {
    for (int x = 0; x < width; ++x) {
      to[3 * x] = from[4 * x];
      to[3 * x + 1] = from[4 * x + 1];
      to[3 * x + 2] = from[4 * x + 2];
    }
  }
}

}  // namespace

bool ReadPlainPngHeader(absl::string_view bytes, PlainPngHeader* header) {
  if (bytes.size() < kIhdrEnd) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (std::memcmp(p, "\x89PNG\r\n\x1a\n", kSignatureBytes) != 0) return false;
  const uint8_t* type = p + kSignatureBytes + 4;
  if (BigEndian32(p + kSignatureBytes) != 13 || !TypeIs(type, "IHDR") || !CrcMatches(type, 13)) {
    return false;
  }
  const uint8_t* ihdr = type + 4;
  const uint32_t width = BigEndian32(ihdr);
  const uint32_t height = BigEndian32(ihdr + 4);
  // Bit depth 8; compression, filter method and interlace all 0.
  if (width == 0 || height == 0 || width > kLibpngMaxSide || height > kLibpngMaxSide ||
      ihdr[8] != 8 || ihdr[10] != 0 || ihdr[11] != 0 || ihdr[12] != 0) {
    return false;
  }
  int channels = 0;
  switch (ihdr[9]) {  // color type
    case 0:
      channels = 1;
      break;
    case 2:
      channels = 3;
      break;
    case 4:
      channels = 2;
      break;
    case 6:
      channels = 4;
      break;
    default:  // 3 (palette) and anything invalid
      return false;
  }
  header->width = static_cast<int>(width);
  header->height = static_cast<int>(height);
  header->stored_channels = channels;
  return true;
}

bool DecodePlainPng(absl::string_view bytes, const PlainPngHeader& header,
                    std::vector<uint8_t>* pixels) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  if (size < kIhdrEnd || header.width <= 0 || header.height <= 0 ||
      header.width > static_cast<int>(kLibpngMaxSide) ||
      header.height > static_cast<int>(kLibpngMaxSide) || header.stored_channels < 1 ||
      header.stored_channels > 4) {
    return false;
  }
  const size_t width = static_cast<size_t>(header.width);
  const size_t height = static_cast<size_t>(header.height);
  ThreadBuffers& buffers = Buffers();
  // On every way out, a huge image's (or a hostile file's many IDAT chunks') buffers go.
  struct TrimOnExit {
    ThreadBuffers& buffers;
    ~TrimOnExit() { buffers.Trim(); }
  } trim{buffers};

  // The chunks first, before anything the size of the image is allocated. IDAT chunks must be
  // consecutive (PNG 5.6); one is the common case and is inflated in place.
  const size_t max_idat_bytes =
      LibpngMaxIdatBytes(width, height, static_cast<size_t>(header.stored_channels));
  const uint8_t* stream = nullptr;
  size_t stream_bytes = 0;
  bool joined = false;
  bool idat_over = false;
  size_t at = kIhdrEnd;
  for (;;) {
    if (size - at < 12) return false;  // truncated, or no IEND
    const uint32_t length = BigEndian32(p + at);
    if (length > 0x7fffffffu || length > size - at - 12) return false;
    const uint8_t* type = p + at + 4;
    if (!CrcMatches(type, length)) return false;
    const uint8_t* data = type + 4;
    if (TypeIs(type, "IDAT")) {
      if (idat_over || length > max_idat_bytes) return false;
      if (stream == nullptr) {
        stream = data;
        stream_bytes = length;
      } else {
        if (!joined) buffers.joined.assign(stream, stream + stream_bytes);
        joined = true;
        buffers.joined.insert(buffers.joined.end(), data, data + length);
      }
    } else {
      if (stream != nullptr) idat_over = true;
      if (TypeIs(type, "IEND")) {
        if (length != 0) return false;
        break;
      }
      if (!IsInertAncillary(type) || length > kLibpngMaxChunkBytes) return false;
    }
    at += 12 + size_t{length};
  }
  if (stream == nullptr) return false;
  if (joined) {
    stream = buffers.joined.data();
    stream_bytes = buffers.joined.size();
  }
  if (stream_bytes < 2) return false;  // not even a zlib header

  const size_t bpp = static_cast<size_t>(header.stored_channels);
  const size_t row_bytes = width * bpp;
  const size_t inflated_bytes = (row_bytes + 1) * height;  // sides <= 10^6: no overflow
  // A stream too short to hold the rows, or whose zlib header declares a window smaller than
  // the rows (zlib, and so libpng, refuses a match reaching past it; libdeflate does not check).
  if (stream_bytes * kDeflateMaxExpansion < inflated_bytes) return false;
  const int window_log = (stream[0] >> 4) + 8;
  if (window_log < 15 && inflated_bytes > (size_t{1} << window_log)) return false;
  if (buffers.inflater == nullptr) buffers.inflater = libdeflate_alloc_decompressor();
  if (buffers.inflater == nullptr) return false;  // out of memory: libpng will say so
  uint8_t* rows = buffers.Rows(inflated_bytes);
  if (rows == nullptr) return false;
  size_t read = 0;
  size_t written = 0;
  // Exactly the rows' bytes from exactly the stream: a short or long one is libpng's to judge
  // (it tolerates some of those with a warning).
  const libdeflate_result inflated = libdeflate_zlib_decompress_ex(
      buffers.inflater, stream, stream_bytes, rows, inflated_bytes, &read, &written);
  if (inflated != LIBDEFLATE_SUCCESS || read != stream_bytes || written != inflated_bytes) {
    return false;
  }
  const int color = header.color_channels();
  pixels->resize(width * height * static_cast<size_t>(color));
  const uint8_t* prev = nullptr;
  for (size_t y = 0; y < height; ++y) {
    uint8_t* row = rows + y * (row_bytes + 1);
    uint8_t* cur = row + 1;
    if (!Unfilter(row[0], cur, prev, row_bytes, bpp)) return false;
    uint8_t* out = pixels->data() + y * width * static_cast<size_t>(color);
    if (header.stored_channels == color) {
      std::memcpy(out, cur, row_bytes);
    } else {
      DropAlpha(cur, header.stored_channels, out, header.width);
    }
    prev = cur;
  }
  return true;
}

}  // namespace dtrain

// libFuzzer target: the plain-PNG fast path (worker/data/plain_png.h) checked against libpng on
// the same bytes. Whenever the fast path decodes, libpng's simplified API must decode too and
// give the same pixels (alpha dropped), since the pipeline trusts the fast path to be libpng
// without its cost. Random bytes rarely survive a PNG's CRCs and zlib's Adler-32, so each input
// is tried twice: as a PNG with its chunks' CRCs repaired, and as the recipe of a valid one (size,
// color type, compression level, IDAT split and the filtered rows, built here with zlib), which
// the fast path must then accept whenever every row's filter is one of PNG's five. A crash, a
// sanitizer report, a difference or a wrong refusal is a finding; a stream zlib refuses and
// libdeflate decodes is the known leniency and is not. Built and run by
// tests/fuzz/run.sh (needs libpng-dev, zlib1g-dev and libdeflate-dev).
#include <png.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/data/plain_png.h"

namespace {

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

void PutBigEndian32(std::string& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>(v >> shift));
}

void SetCrc(std::string& png, size_t chunk_at, uint32_t length) {
  const uint32_t crc =
      crc32(0, reinterpret_cast<const Bytef*>(png.data() + chunk_at + 4), length + 4);
  for (int i = 0; i < 4; ++i) {
    png[chunk_at + 8 + length + i] = static_cast<char>(crc >> (24 - 8 * i));
  }
}

void AppendChunk(std::string& png, const char* type, const std::string& data) {
  const size_t at = png.size();
  PutBigEndian32(png, static_cast<uint32_t>(data.size()));
  png.append(type, 4);
  png += data;
  png.append(4, '\0');
  SetCrc(png, at, static_cast<uint32_t>(data.size()));
}

// Whether zlib refuses the IDAT stream that libdeflate accepted: the known leniency
// (worker/data/plain_png.h), which is not a finding. Anything else libpng refuses is.
bool ZlibRefusesTheStream(const std::string& png, const dtrain::PlainPngHeader& header) {
  std::string stream;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = BigEndian32(reinterpret_cast<const uint8_t*>(png.data()) + at);
    if (length > png.size() - at - 12) break;
    if (png.compare(at + 4, 4, "IDAT") == 0) stream.append(png, at + 8, length);
    at += 12 + size_t{length};
  }
  uLongf size = static_cast<uLongf>(header.height) *
                (static_cast<uLongf>(header.width) * header.stored_channels + 1);
  std::vector<uint8_t> rows(size);
  return uncompress(rows.data(), &size, reinterpret_cast<const Bytef*>(stream.data()),
                    stream.size()) != Z_OK;
}

// Returns whether the fast path decoded; aborts when it did and libpng disagrees.
bool FastAgreesWithLibpng(const std::string& png) {
  dtrain::PlainPngHeader header;
  if (!dtrain::ReadPlainPngHeader(png, &header)) return false;
  // The caller's size limit, as image_decode.cc applies it before allocating.
  if (int64_t{header.width} * header.height > (1 << 20)) return false;
  const int channels = header.color_channels();
  std::vector<uint8_t> fast;
  if (!dtrain::DecodePlainPng(png, header, &fast)) return false;

  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, png.data(), png.size())) {
    if (!ZlibRefusesTheStream(png, header)) std::abort();
    png_image_free(&image);
    return true;
  }
  if (static_cast<int>(image.width) != header.width ||
      static_cast<int>(image.height) != header.height) {
    std::abort();
  }
  const bool alpha = header.stored_channels % 2 == 0;
  image.format = channels == 3 ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                               : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  std::vector<uint8_t> slow(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, slow.data(), 0, nullptr)) {
    if (!ZlibRefusesTheStream(png, header)) std::abort();
    return true;
  }
  const size_t pixels = static_cast<size_t>(header.width) * header.height;
  for (size_t i = 0; i < pixels; ++i) {
    for (int c = 0; c < channels; ++c) {
      if (fast[i * channels + c] != slow[i * header.stored_channels + c]) std::abort();
    }
  }
  return true;
}

// The input as a PNG, every chunk whose length fits given its right CRC.
void AsRepairedPng(const uint8_t* data, size_t size) {
  std::string png(reinterpret_cast<const char*>(data), size);
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = BigEndian32(reinterpret_cast<const uint8_t*>(png.data()) + at);
    if (length > png.size() - at - 12) break;
    SetCrc(png, at, length);
    at += 12 + size_t{length};
  }
  FastAgreesWithLibpng(png);
}

// The input as a recipe: 6 bytes of parameters, then the rows (filter byte and samples each).
void AsRecipe(const uint8_t* data, size_t size) {
  if (size < 6) return;
  const int width = 1 + data[0] % 48;
  const int height = 1 + data[1] % 48;
  const int color_types[] = {0, 2, 4, 6};
  const int stored[] = {1, 3, 2, 4};
  const int kind = data[2] % 4;
  const int level = data[3] % 10;
  const int idat_parts = 1 + data[4] % 4;
  const bool exact = data[5] % 8 != 0;  // else the rows are what the input holds, any length
  const size_t row_bytes = static_cast<size_t>(width) * stored[kind] + 1;
  std::string rows(reinterpret_cast<const char*>(data + 6), size - 6);
  bool filters_known = true;
  if (exact) {
    rows.resize(row_bytes * height, '\0');
    for (int y = 0; y < height; ++y) {
      if (static_cast<uint8_t>(rows[y * row_bytes]) > 4) filters_known = false;
    }
  }
  // One deflate state for every input: setting one up per input (compress2) made this target
  // spend most of its time in zlib's allocations and their page faults.
  static z_stream* deflater = [] {
    auto* z = new z_stream{};
    if (deflateInit(z, Z_DEFAULT_COMPRESSION) != Z_OK) std::abort();
    return z;
  }();
  if (deflateReset(deflater) != Z_OK ||
      deflateParams(deflater, level, Z_DEFAULT_STRATEGY) != Z_OK) {
    std::abort();
  }
  std::string packed(deflateBound(deflater, rows.size()), '\0');
  deflater->next_in = reinterpret_cast<Bytef*>(rows.data());
  deflater->avail_in = static_cast<uInt>(rows.size());
  deflater->next_out = reinterpret_cast<Bytef*>(packed.data());
  deflater->avail_out = static_cast<uInt>(packed.size());
  if (deflate(deflater, Z_FINISH) != Z_STREAM_END) std::abort();
  packed.resize(deflater->total_out);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  PutBigEndian32(ihdr, static_cast<uint32_t>(width));
  PutBigEndian32(ihdr, static_cast<uint32_t>(height));
  ihdr += static_cast<char>(8);
  ihdr += static_cast<char>(color_types[kind]);
  ihdr.append(3, '\0');
  AppendChunk(png, "IHDR", ihdr);
  const size_t step = (packed.size() + idat_parts - 1) / idat_parts;
  for (size_t at = 0; at < packed.size(); at += step) {
    AppendChunk(png, "IDAT", packed.substr(at, step));
  }
  AppendChunk(png, "IEND", "");
  const bool decoded = FastAgreesWithLibpng(png);
  if (exact && filters_known && !decoded) std::abort();  // a valid plain PNG refused
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  AsRepairedPng(data, size);
  AsRecipe(data, size);
  return 0;
}

// The plain-PNG fast path (worker/data/plain_png.h) against libpng, which writes every image
// here with one row filter forced at a time: each color type and filter must decode to the
// pixels written, and every PNG the fast path must not take (gamma, transparency, palette,
// 16 bits, interlaced, a bad CRC, a cut or over-long stream) must be declined, and then still
// be decoded or refused by DecodeImage exactly as libpng decides.
#include "worker/data/plain_png.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/image_decode.h"

namespace dtrain {
namespace plain_png_test {

using ::testing::HasSubstr;

struct PngWrite {
  int width = 13;
  int height = 11;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  int filter = PNG_FILTER_PAETH;
  int interlace = PNG_INTERLACE_NONE;
  size_t idat_bytes = 8192;  // libpng's compression buffer: a smaller one splits IDAT
  bool gamma = false;
  bool transparency = false;
  bool text = false;
};

int StoredChannels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
    case PNG_COLOR_TYPE_PALETTE:
      return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    default:
      return 4;
  }
}

// Varied enough that every filter predicts badly somewhere (so each one's arithmetic shows).
std::vector<uint8_t> Pixels(const PngWrite& w) {
  const int bytes_per_sample = w.bit_depth / 8;
  std::vector<uint8_t> pixels(static_cast<size_t>(w.width) * w.height *
                              StoredChannels(w.color_type) * bytes_per_sample);
  uint32_t state = 12345;
  for (size_t i = 0; i < pixels.size(); ++i) {
    state = state * 1103515245u + 12345u;
    pixels[i] = static_cast<uint8_t>(i % 3 == 0 ? (state >> 16) : (i * 7 + (i / 29) * 5));
  }
  if (w.color_type == PNG_COLOR_TYPE_PALETTE) {
    for (uint8_t& p : pixels) p %= 4;
  }
  return pixels;
}

void AppendBytes(png_structp png, png_bytep data, size_t length) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  out->append(reinterpret_cast<const char*>(data), length);
}

void NoFlush(png_structp) {}

std::string Encode(const PngWrite& w, const std::vector<uint8_t>& pixels) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ADD_FAILURE() << "libpng could not write the test image";
    return "";
  }
  png_set_write_fn(png, &out, AppendBytes, NoFlush);
  png_set_IHDR(png, info, w.width, w.height, w.bit_depth, w.color_type, w.interlace,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_filter(png, PNG_FILTER_TYPE_BASE, w.filter);
  png_set_compression_buffer_size(png, w.idat_bytes);
  if (w.color_type == PNG_COLOR_TYPE_PALETTE) {
    png_color palette[4] = {{0, 0, 0}, {255, 0, 0}, {0, 200, 0}, {10, 20, 250}};
    png_set_PLTE(png, info, palette, 4);
  }
  if (w.gamma) png_set_gAMA_fixed(png, info, 100000);  // 1.0: libpng converts to sRGB's 2.2
  if (w.transparency) {
    png_color_16 key{};
    key.gray = 7;
    png_set_tRNS(png, info, nullptr, 0, &key);
  }
  if (w.text) {
    png_text text{};
    text.compression = PNG_TEXT_COMPRESSION_NONE;
    text.key = const_cast<char*>("Comment");
    text.text = const_cast<char*>("written by plain_png_test");
    png_set_text(png, info, &text, 1);
  }
  png_write_info(png, info);
  if (w.bit_depth == 16) png_set_swap(png);  // the pixels are little-endian uint16 here
  const size_t row_bytes =
      static_cast<size_t>(w.width) * StoredChannels(w.color_type) * (w.bit_depth / 8);
  const int passes = w.interlace == PNG_INTERLACE_NONE ? 1 : png_set_interlace_handling(png);
  for (int pass = 0; pass < passes; ++pass) {
    for (int y = 0; y < w.height; ++y) {
      png_write_row(png, const_cast<uint8_t*>(pixels.data()) + y * row_bytes);
    }
  }
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return out;
}

// The written pixels as the decode gives them: alpha dropped.
std::vector<uint8_t> WithoutAlpha(const std::vector<uint8_t>& pixels, int stored) {
  if (stored == 1 || stored == 3) return pixels;
  const int color = stored - 1;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < pixels.size(); i += stored) {
    out.insert(out.end(), pixels.begin() + i, pixels.begin() + i + color);
  }
  return out;
}

int CountChunks(const std::string& png, const char* type) {
  int count = 0;
  for (size_t at = png.find(type); at != std::string::npos; at = png.find(type, at + 4)) ++count;
  return count;
}

TEST(PlainPngTest, EveryColorTypeAndFilter_DecodesToThePixelsWritten) {
  const std::pair<int, const char*> filters[] = {{PNG_FILTER_NONE, "none"},
                                                 {PNG_FILTER_SUB, "sub"},
                                                 {PNG_FILTER_UP, "up"},
                                                 {PNG_FILTER_AVG, "average"},
                                                 {PNG_FILTER_PAETH, "paeth"}};
  for (int color_type : {PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                         PNG_COLOR_TYPE_RGB_ALPHA}) {
    for (const auto& [filter, filter_name] : filters) {
      SCOPED_TRACE(absl::StrCat("color type ", color_type, ", filter ", filter_name));
      PngWrite w;
      w.color_type = color_type;
      w.filter = filter;
      const std::vector<uint8_t> written = Pixels(w);
      const std::string png = Encode(w, written);
      PlainPngHeader header;
      ASSERT_TRUE(ReadPlainPngHeader(png, &header));
      EXPECT_EQ(header.width, 13);
      EXPECT_EQ(header.height, 11);
      EXPECT_EQ(header.stored_channels, StoredChannels(color_type));
      const std::vector<uint8_t> expected = WithoutAlpha(written, header.stored_channels);
      std::vector<uint8_t> decoded(expected.size(), 0xEE);
      ASSERT_TRUE(DecodePlainPng(png, header, &decoded));
      EXPECT_EQ(decoded, expected);

      ImageDecodeOptions options;
      options.channels = header.color_channels();
      absl::StatusOr<DecodedImage> image = DecodeImage(png, options);
      ASSERT_TRUE(image.ok()) << image.status();
      EXPECT_EQ(image->pixels, expected);
    }
  }
}

TEST(PlainPngTest, StreamOverSeveralIdatChunksAndTextChunk_Decodes) {
  PngWrite w;
  w.width = 40;
  w.height = 30;
  w.idat_bytes = 64;
  w.text = true;
  const std::vector<uint8_t> written = Pixels(w);
  const std::string png = Encode(w, written);
  ASSERT_GT(CountChunks(png, "IDAT"), 3);
  ASSERT_EQ(CountChunks(png, "tEXt"), 1);
  PlainPngHeader header;
  ASSERT_TRUE(ReadPlainPngHeader(png, &header));
  std::vector<uint8_t> decoded(written.size());
  ASSERT_TRUE(DecodePlainPng(png, header, &decoded));
  EXPECT_EQ(decoded, written);
}

// What libpng does with these is libpng's business (gamma converts, tRNS is alpha, a palette
// expands): the fast path must leave them to it, and DecodeImage must still agree with libpng.
TEST(PlainPngTest, PngsThatAreNotPlain_DeclinedAndStillDecodedByLibpng) {
  struct Case {
    const char* name;
    PngWrite w;
    bool header_plain;
  };
  std::vector<Case> cases;
  {
    PngWrite w;
    w.color_type = PNG_COLOR_TYPE_GRAY;
    w.gamma = true;
    cases.push_back({"gAMA", w, true});
  }
  {
    PngWrite w;
    w.color_type = PNG_COLOR_TYPE_GRAY;
    w.transparency = true;
    cases.push_back({"tRNS", w, true});
  }
  {
    PngWrite w;
    w.color_type = PNG_COLOR_TYPE_PALETTE;
    cases.push_back({"palette", w, false});
  }
  {
    PngWrite w;
    w.bit_depth = 16;
    cases.push_back({"16 bits", w, false});
  }
  {
    PngWrite w;
    w.interlace = PNG_INTERLACE_ADAM7;
    cases.push_back({"interlaced", w, false});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> written = Pixels(c.w);
    const std::string png = Encode(c.w, written);
    PlainPngHeader header;
    ASSERT_EQ(ReadPlainPngHeader(png, &header), c.header_plain);
    if (c.header_plain) {
      std::vector<uint8_t> decoded(static_cast<size_t>(header.width) * header.height *
                                   header.color_channels());
      EXPECT_FALSE(DecodePlainPng(png, header, &decoded));
    }
    // libpng's own answer, through its simplified API, is what DecodeImage must give.
    png_image image;
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    ASSERT_TRUE(png_image_begin_read_from_memory(&image, png.data(), png.size()));
    // Read with alpha when the file has any (tRNS makes some), which is then dropped: PIL's
    // convert() drops it too rather than composite.
    const bool color = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
    const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    image.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                         : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
    std::vector<uint8_t> with_alpha(PNG_IMAGE_SIZE(image));
    ASSERT_TRUE(png_image_finish_read(&image, nullptr, with_alpha.data(), 0, nullptr));
    const int color_channels = color ? 3 : 1;
    const std::vector<uint8_t> reference =
        WithoutAlpha(with_alpha, color_channels + (alpha ? 1 : 0));
    ImageDecodeOptions options;
    options.channels = color ? 3 : 1;
    absl::StatusOr<DecodedImage> decoded = DecodeImage(png, options);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->pixels, reference);
  }
  // The gAMA case really is one where libpng changes the pixels: declining it matters.
  PngWrite gamma;
  gamma.color_type = PNG_COLOR_TYPE_GRAY;
  gamma.gamma = true;
  const std::vector<uint8_t> written = Pixels(gamma);
  ImageDecodeOptions gray;
  gray.channels = 1;
  absl::StatusOr<DecodedImage> converted = DecodeImage(Encode(gamma, written), gray);
  ASSERT_TRUE(converted.ok());
  EXPECT_NE(converted->pixels, written);
}

std::string Chunk(const char* type, const std::string& data) {
  std::string out;
  const uint32_t length = static_cast<uint32_t>(data.size());
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>(length >> shift));
  const std::string body = std::string(type, 4) + data;
  out += body;
  const uint32_t crc =
      crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()));
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>(crc >> shift));
  return out;
}

// A gray 8-bit PNG's IHDR data.
std::string GrayIhdr(int width, int height) {
  std::string ihdr;
  for (uint32_t v : {static_cast<uint32_t>(width), static_cast<uint32_t>(height)}) {
    for (int shift : {24, 16, 8, 0}) ihdr.push_back(static_cast<char>(v >> shift));
  }
  return ihdr + std::string("\x08\x00\x00\x00\x00", 5);
}

// `raw` as a zlib stream with a window of 2^window_bits bytes.
std::string Zlib(const std::string& raw, int window_bits = 15) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string packed(deflateBound(&z, raw.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(packed.data());
  z.avail_out = static_cast<uInt>(packed.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  packed.resize(z.total_out);
  deflateEnd(&z);
  return packed;
}

// The signature and `chunks` (each a type and its data) in order.
std::string Assemble(const std::vector<std::pair<const char*, std::string>>& chunks) {
  std::string png("\x89PNG\r\n\x1a\n", 8);
  for (const auto& [type, data] : chunks) png += Chunk(type, data);
  return png;
}

// A gray 8-bit PNG whose inflated stream is `raw` (filter bytes included) with intact CRCs:
// what libpng's writer cannot make (an unknown filter, a stream with bytes to spare).
std::string HandMadeGrayPng(int width, int height, const std::string& raw) {
  return Assemble({{"IHDR", GrayIhdr(width, height)}, {"IDAT", Zlib(raw)}, {"IEND", ""}});
}

// The PNG specification's reconstruction (9.2, 9.4), written as it reads there: Recon(x) =
// Filt(x) + predictor, bytes outside the image counting as 0.
std::vector<uint8_t> SpecReconstruct(const std::string& raw, int width, int height, int bpp) {
  const int stride = width * bpp;
  std::vector<uint8_t> out(static_cast<size_t>(stride) * height);
  auto recon = [&](int y, int i) -> int {
    return y < 0 || i < 0 ? 0 : out[static_cast<size_t>(y) * stride + i];
  };
  for (int y = 0; y < height; ++y) {
    const int type = static_cast<uint8_t>(raw[static_cast<size_t>(y) * (stride + 1)]);
    for (int i = 0; i < stride; ++i) {
      const int filt = static_cast<uint8_t>(raw[static_cast<size_t>(y) * (stride + 1) + 1 + i]);
      const int a = recon(y, i - bpp), b = recon(y - 1, i), c = recon(y - 1, i - bpp);
      int predictor = 0;
      if (type == 1) predictor = a;
      if (type == 2) predictor = b;
      if (type == 3) predictor = (a + b) / 2;
      if (type == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        predictor = pa <= pb && pa <= pc ? a : (pb <= pc ? b : c);
      }
      out[static_cast<size_t>(y) * stride + i] = static_cast<uint8_t>(filt + predictor);
    }
  }
  return out;
}

TEST(PlainPngTest, HandMadePng_EveryFilterInOneImage) {
  // Row y uses filter y % 5, over pseudo-random bytes: every Paeth branch is taken.
  const int width = 17;
  const int height = 23;
  std::string raw;
  uint32_t state = 7;
  for (int y = 0; y < height; ++y) {
    raw.push_back(static_cast<char>(y % 5));
    for (int x = 0; x < width; ++x) {
      state = state * 1103515245u + 12345u;
      raw.push_back(static_cast<char>(state >> 16));
    }
  }
  const std::string png = HandMadeGrayPng(width, height, raw);
  PlainPngHeader header;
  ASSERT_TRUE(ReadPlainPngHeader(png, &header));
  std::vector<uint8_t> decoded(width * height);
  ASSERT_TRUE(DecodePlainPng(png, header, &decoded));
  EXPECT_EQ(decoded, SpecReconstruct(raw, width, height, 1));
}

// Damage the fast path finds is reported by libpng, in libpng's words; what libpng tolerates
// (a stream with bytes to spare) it still decodes.
TEST(PlainPngTest, DamagedPlainPngs_DeclinedAndLeftToLibpng) {
  PngWrite w;
  w.color_type = PNG_COLOR_TYPE_GRAY;
  const std::string png = Encode(w, Pixels(w));
  const size_t idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  uint32_t idat_length = 0;
  for (size_t i = idat - 4; i < idat; ++i) idat_length = idat_length << 8 | uint8_t(png[i]);
  std::string bad_crc = png;  // the CRC itself damaged, the data intact
  bad_crc[idat + 4 + idat_length] = static_cast<char>(bad_crc[idat + 4 + idat_length] ^ 0x01);
  const std::string cut = png.substr(0, png.size() - 20);  // inside IDAT or its CRC, no IEND
  std::string rows(static_cast<size_t>(w.height) * (w.width + 1), '\x01');
  rows[0] = '\x09';  // no such filter
  const std::string bad_filter = HandMadeGrayPng(w.width, w.height, rows);
  struct Case {
    const char* name;
    const std::string& bytes;
    const char* libpng_says;
  };
  for (const Case& c : {Case{"bad CRC", bad_crc, "CRC error"}, Case{"cut", cut, ""},
                        Case{"unknown filter", bad_filter, "bad adaptive filter value"}}) {
    SCOPED_TRACE(c.name);
    PlainPngHeader header;
    ASSERT_TRUE(ReadPlainPngHeader(c.bytes, &header));
    std::vector<uint8_t> decoded(static_cast<size_t>(header.width) * header.height);
    EXPECT_FALSE(DecodePlainPng(c.bytes, header, &decoded));
    ImageDecodeOptions gray;
    gray.channels = 1;
    absl::StatusOr<DecodedImage> image = DecodeImage(c.bytes, gray);
    EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(image.status().message(), HasSubstr("PNG image: corrupt or truncated: "));
    if (*c.libpng_says != '\0') {
      EXPECT_THAT(std::string(image.status().message()), HasSubstr(c.libpng_says));
    }
  }

  std::string spare(static_cast<size_t>(w.height + 2) * (w.width + 1), '\0');
  const std::string long_stream = HandMadeGrayPng(w.width, w.height, spare);
  PlainPngHeader header;
  ASSERT_TRUE(ReadPlainPngHeader(long_stream, &header));
  std::vector<uint8_t> decoded(static_cast<size_t>(header.width) * header.height);
  EXPECT_FALSE(DecodePlainPng(long_stream, header, &decoded));
  ImageDecodeOptions gray;
  gray.channels = 1;
  absl::StatusOr<DecodedImage> image = DecodeImage(long_stream, gray);
  ASSERT_TRUE(image.ok()) << image.status();  // libpng warns about the extra data and decodes
  EXPECT_EQ(image->pixels,
            std::vector<uint8_t>(static_cast<size_t>(header.width) * header.height, 0));
}

// Every layout of chunks the fast path takes or leaves: what it takes must decode to the pixels
// (rows of filter None here, so the raw bytes are the pixels); what it leaves, libpng decodes or
// refuses as before.
TEST(PlainPngTest, ChunkLayouts_TakenOrLeftToLibpng) {
  const int width = 300;
  const int height = 200;
  std::string raw;
  std::vector<uint8_t> pixels;
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');
    for (int x = 0; x < width; ++x) {
      const auto v = static_cast<uint8_t>((x * 7 + y * 13 + (x * y) % 11) & 0xFF);
      raw.push_back(static_cast<char>(v));
      pixels.push_back(v);
    }
  }
  const std::string ihdr = GrayIhdr(width, height);
  const std::string stream = Zlib(raw);
  const std::string first = stream.substr(0, stream.size() / 2);
  const std::string second = stream.substr(stream.size() / 2);
  // Window 2^9 = 512 bytes, smaller than the 60,200 inflated. This encoder never reaches back
  // further than its window, so libpng decodes it; the fast path cannot know that and leaves it.
  const std::string small_window = Zlib(raw, 9);
  // Rows that repeat 4 rows (1,204 bytes) back, compressed with a 32 KiB window and then
  // declared as 512 bytes: zlib (so libpng) refuses the matches; libdeflate would not notice.
  std::string repeating;
  uint32_t state = 99;
  for (int y = 0; y < height; ++y) {
    repeating.push_back('\0');
    for (int x = 0; x < width; ++x) {
      state = state * 1103515245u + 12345u;
      repeating.push_back(y < 4 ? static_cast<char>(state >> 16)
                                : repeating[repeating.size() - 4 * (width + 1)]);
    }
  }
  const auto with_header = [](std::string zlib, unsigned cmf, bool dictionary) {
    unsigned flg = (static_cast<uint8_t>(zlib[1]) & 0xC0u) | (dictionary ? 0x20u : 0u);
    flg += (31 - (cmf * 256 + flg) % 31) % 31;  // FCHECK
    zlib[0] = static_cast<char>(cmf);
    zlib[1] = static_cast<char>(flg);
    return zlib;
  };
  const std::string too_small_window = with_header(Zlib(repeating), 0x18, false);
  // FDICT set, with a dictionary id after the header: zlib asks for a dictionary libpng has not.
  std::string dictionary = with_header(stream, static_cast<uint8_t>(stream[0]), true);
  dictionary.insert(2, std::string("\0\0\0\1", 4));
  // An IDAT chunk longer than libpng's png_check_chunk_length limit (max(8,000,000, the rows
  // plus zlib's overhead)), padded with empty stored blocks: valid deflate. libpng 1.6.39 as
  // Debian builds it decodes it anyway; the fast path stays inside the limit and leaves it.
  std::string padded = stream.substr(0, 2);
  for (int i = 0; i < 1600001; ++i) padded.append("\0\0\0\xff\xff", 5);
  padded += stream.substr(2);
  enum Libpng { kRefuses, kDecodes, kNotAsserted };
  struct Case {
    const char* name;
    std::string png;
    bool fast;      // the fast path decodes it
    Libpng libpng;  // what libpng's simplified API does with it
  };
  const Case cases[] = {
      {"one IDAT", Assemble({{"IHDR", ihdr}, {"IDAT", stream}, {"IEND", ""}}), true, kDecodes},
      {"split IDAT", Assemble({{"IHDR", ihdr}, {"IDAT", first}, {"IDAT", second}, {"IEND", ""}}),
       true, kDecodes},
      {"empty IDAT first", Assemble({{"IHDR", ihdr}, {"IDAT", ""}, {"IDAT", stream}, {"IEND", ""}}),
       true, kDecodes},
      {"tEXt, pHYs and tIME around",
       Assemble({{"IHDR", ihdr},
                 {"tEXt", std::string("Title\0x", 7)},
                 {"pHYs", std::string(9, '\1')},
                 {"IDAT", stream},
                 {"tIME", std::string("\x07\xea\x0b\x1d\x0a\x00\x00", 7)},
                 {"IEND", ""}}),
       true, kDecodes},
      {"bytes after IEND", Assemble({{"IHDR", ihdr}, {"IDAT", stream}, {"IEND", ""}}) + "trailing",
       true, kDecodes},
      {"IDAT, tEXt, IDAT",
       Assemble({{"IHDR", ihdr},
                 {"IDAT", first},
                 {"tEXt", std::string("Title\0x", 7)},
                 {"IDAT", second},
                 {"IEND", ""}}),
       false, kNotAsserted},
      {"sRGB", Assemble({{"IHDR", ihdr}, {"sRGB", "\0"}, {"IDAT", stream}, {"IEND", ""}}), false,
       kDecodes},
      {"bKGD",
       Assemble({{"IHDR", ihdr}, {"bKGD", std::string(2, '\0')}, {"IDAT", stream}, {"IEND", ""}}),
       false, kDecodes},
      {"zTXt",
       Assemble({{"IHDR", ihdr},
                 {"zTXt", std::string("Title\0\0", 7) + Zlib("x")},
                 {"IDAT", stream},
                 {"IEND", ""}}),
       false, kDecodes},
      {"tEXt over 8,000,000 bytes",
       Assemble({{"IHDR", ihdr},
                 {"tEXt", "Title" + std::string(1, '\0') + std::string(7999995, 'x')},
                 {"IDAT", stream},
                 {"IEND", ""}}),
       false, kDecodes},
      {"IDAT over libpng's limit", Assemble({{"IHDR", ihdr}, {"IDAT", padded}, {"IEND", ""}}),
       false, kDecodes},
      {"IEND with data", Assemble({{"IHDR", ihdr}, {"IDAT", stream}, {"IEND", "x"}}), false,
       kNotAsserted},
      {"no IEND", Assemble({{"IHDR", ihdr}, {"IDAT", stream}}), false, kNotAsserted},
      {"a stream too short for the rows",
       Assemble({{"IHDR", ihdr}, {"IDAT", Zlib(std::string(50, '\0'))}, {"IEND", ""}}), false,
       kRefuses},
      {"a window smaller than the image, never overstepped",
       Assemble({{"IHDR", ihdr}, {"IDAT", small_window}, {"IEND", ""}}), false, kDecodes},
      {"a window smaller than the matches",
       Assemble({{"IHDR", ihdr}, {"IDAT", too_small_window}, {"IEND", ""}}), false, kRefuses},
      {"preset dictionary", Assemble({{"IHDR", ihdr}, {"IDAT", dictionary}, {"IEND", ""}}), false,
       kRefuses},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PlainPngHeader header;
    ASSERT_TRUE(ReadPlainPngHeader(c.png, &header));
    std::vector<uint8_t> decoded;
    ASSERT_EQ(DecodePlainPng(c.png, header, &decoded), c.fast);
    if (c.fast) {
      EXPECT_EQ(decoded, pixels);
    }
    // DecodeImage agrees with libpng's simplified API on every one of them.
    png_image image;
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    std::vector<uint8_t> reference;
    bool libpng_ok = png_image_begin_read_from_memory(&image, c.png.data(), c.png.size()) != 0;
    if (libpng_ok) {
      image.format = PNG_FORMAT_GRAY;
      reference.resize(PNG_IMAGE_SIZE(image));
      libpng_ok = png_image_finish_read(&image, nullptr, reference.data(), 0, nullptr) != 0;
    } else {
      png_image_free(&image);
    }
    ImageDecodeOptions gray;
    gray.channels = 1;
    absl::StatusOr<DecodedImage> got = DecodeImage(c.png, gray);
    ASSERT_EQ(got.ok(), libpng_ok) << got.status();
    if (c.libpng != kNotAsserted) {
      EXPECT_EQ(libpng_ok, c.libpng == kDecodes) << "libpng's verdict";
    }
    if (libpng_ok) {
      EXPECT_EQ(got->pixels, reference);
    }
    if (c.fast) {
      EXPECT_TRUE(libpng_ok);
    }
  }
}

// ReadImageHeader answers a plain PNG from its IHDR alone, limits included.
TEST(PlainPngTest, HeaderOfAPlainPng_FromIhdrWithTheLimits) {
  const std::string png = HandMadeGrayPng(40, 30, std::string(30 * 41, '\0'));
  absl::StatusOr<ImageHeader> header = ReadImageHeader(png);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->format, ImageFormat::kPng);
  EXPECT_EQ(header->width, 40);
  EXPECT_EQ(header->height, 30);
  ImageDecodeLimits small;
  small.max_pixels = 1000;
  absl::StatusOr<ImageHeader> refused = ReadImageHeader(png, small);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("PNG image: too large: 40x30"));
  PlainPngHeader at_limit;
  EXPECT_TRUE(ReadPlainPngHeader(Assemble({{"IHDR", GrayIhdr(1000000, 1)}}), &at_limit));
  EXPECT_EQ(at_limit.width, 1000000);
  // Over libpng's own limit of 1,000,000 a side: not plain, so libpng's refusal stands.
  const std::string wide = Assemble({{"IHDR", GrayIhdr(1000001, 1)}, {"IEND", ""}});
  PlainPngHeader plain;
  EXPECT_FALSE(ReadPlainPngHeader(wide, &plain));
  EXPECT_EQ(ReadImageHeader(wide).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace plain_png_test
}  // namespace dtrain

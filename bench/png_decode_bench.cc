// PNG decoding of a shard's images on one thread (bench/png_decode.sh): DecodeImage, which takes
// plain PNGs through worker/data/plain_png (libdeflate, whole-buffer), against libpng's
// simplified API as image_decode used it before (begin_read, finish_read into a buffer, the copy
// out), and libdeflate's inflate of the same IDAT streams alone (the floor: no chunk walk, no
// unfiltering). The three alternate pass by pass over the same bytes in memory, so a slow
// moment of the machine touches all of them. The images must be plain gray PNGs (the libpng
// row asks for gray), which the bench checks first. Prints one JSON row per system:
//   {"system": ..., "images": N, "seconds": S, "ns_per_image": T}
#include <libdeflate.h>
#include <png.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "worker/data/image_decode.h"
#include "worker/data/plain_png.h"
#include "worker/data/tar_shard_reader.h"

ABSL_FLAG(std::string, shards, "", "directory holding the *.tar shards with .png fields");
ABSL_FLAG(int, max_images, 20000, "images read from the shards");
ABSL_FLAG(int, passes, 7, "passes over the images per system (alternating)");

namespace {

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// The IDAT data joined, for the inflate-only floor (the bench trusts its own input).
std::string IdatStream(const std::string& png) {
  std::string stream;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = BigEndian32(reinterpret_cast<const uint8_t*>(png.data()) + at);
    if (png.compare(at + 4, 4, "IDAT") == 0) stream.append(png, at + 8, length);
    at += 12 + size_t{length};
  }
  return stream;
}

uint64_t sink = 0;

void LibpngSimplified(const std::string& bytes) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) std::abort();
  image.format = PNG_FORMAT_GRAY;
  std::vector<uint8_t> decoded(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, decoded.data(), 0, nullptr)) std::abort();
  std::vector<uint8_t> out(decoded);  // image_decode's CopyWindow
  sink += out[out.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> images;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(absl::GetFlag(FLAGS_shards))) {
    if (entry.path().extension() == ".tar") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  const size_t wanted = static_cast<size_t>(absl::GetFlag(FLAGS_max_images));
  for (const std::string& path : paths) {
    auto reader = dtrain::TarShardReader::Open(path);
    if (!reader.ok()) continue;
    while (images.size() < wanted) {
      auto sample = (*reader)->Next();
      if (!sample.ok() || !sample->has_value()) break;
      auto png = (*sample)->fields.find("png");
      if (png != (*sample)->fields.end()) images.push_back(png->second);
    }
    if (images.size() >= wanted) break;
  }
  if (images.empty()) {
    std::fprintf(stderr, "no .png fields in the shards of %s\n",
                 absl::GetFlag(FLAGS_shards).c_str());
    return 1;
  }
  std::vector<std::string> streams;
  for (const std::string& png : images) streams.push_back(IdatStream(png));
  dtrain::ImageDecodeOptions gray;
  gray.channels = 1;
  libdeflate_decompressor* inflater = libdeflate_alloc_decompressor();
  std::vector<uint8_t> inflated(size_t{1} << 20);

  struct System {
    const char* name;
    std::function<void(size_t)> decode;
    double seconds = 0;
  };
  std::vector<System> systems = {
      {"dtrain DecodeImage",
       [&](size_t i) {
         auto image = dtrain::DecodeImage(images[i], gray);
         if (!image.ok()) std::abort();
         sink += image->pixels[image->pixels.size() / 2];
       }},
      {"libpng simplified API", [&](size_t i) { LibpngSimplified(images[i]); }},
      {"libdeflate inflate alone",
       [&](size_t i) {
         size_t written = 0;
         if (libdeflate_zlib_decompress(inflater, streams[i].data(), streams[i].size(),
                                        inflated.data(), inflated.size(),
                                        &written) != LIBDEFLATE_SUCCESS) {
           std::abort();
         }
         sink += inflated[written / 2];
       }},
  };
  // The comparison means something only if the images are gray and take the fast path, and both
  // systems agree on them.
  for (size_t i = 0; i < images.size(); ++i) {
    dtrain::PlainPngHeader header;
    std::vector<uint8_t> fast;
    if (!dtrain::ReadPlainPngHeader(images[i], &header) || header.stored_channels != 1 ||
        !dtrain::DecodePlainPng(images[i], header, &fast)) {
      std::fprintf(stderr, "image %zu is not a plain gray PNG: this bench compares those\n", i);
      return 1;
    }
    auto image = dtrain::DecodeImage(images[i], gray);
    if (!image.ok() || image->pixels != fast) {
      std::fprintf(stderr, "image %zu: DecodeImage and the plain path disagree\n", i);
      return 1;
    }
  }
  for (int pass = 0; pass < absl::GetFlag(FLAGS_passes); ++pass) {
    for (System& s : systems) {
      const auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < images.size(); ++i) s.decode(i);
      s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  libdeflate_free_decompressor(inflater);
  const double count = static_cast<double>(images.size()) * absl::GetFlag(FLAGS_passes);
  for (const System& s : systems) {
    std::printf(
        "{\"system\": \"%s\", \"images\": %.0f, \"seconds\": %.3f, \"ns_per_image\": %.0f}\n",
        s.name, count, s.seconds, s.seconds / count * 1e9);
  }
  std::fprintf(stderr, "(checksum %llu)\n", static_cast<unsigned long long>(sink));
  return 0;
}

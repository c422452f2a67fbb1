// The image input pipeline's throughput on N threads (bench/data.sh): WebDataset shards of JPEGs
// decoded and augmented (RandomResizedCrop(224), RandomHorizontalFlip, Normalize) by the
// streaming pipeline a training rank runs (ShardedSplit with data.num_workers threads, the
// spec's fields and transforms through MakeSampleDecoder, batches of 64 positions for one
// epoch), against libjpeg-turbo's decode alone on the same JPEGs (the ceiling: tjDecompress2 of
// bytes already in memory, so the ceiling pays no tar reading while dtrain's pipeline does).
// Two hand-made loops over TarShardReader + the transforms (no shuffle buffer, no collation)
// stay as rows too, for what the streaming machinery costs over them.
// Prints one JSON row per measurement:
//   {"system": ..., "samples": N, "seconds": S, "samples_per_s": R}
// Thread-safety: each thread owns its readers, decoders and random generators.
#include <ATen/Parallel.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_transforms.h"
#include "worker/data/sample_decoder.h"
#include "worker/data/shard_catalog.h"
#include "worker/data/sharded_split.h"
#include "worker/data/tar_shard_reader.h"
#include "worker/runtime/worker_allocator.h"

ABSL_FLAG(std::string, shards, "", "directory holding the shard-*.tar files");
ABSL_FLAG(int, threads, 2, "worker threads for every measurement");
ABSL_FLAG(bool, pipeline_only, false, "measure dtrain's pipeline alone (for profiling)");
ABSL_FLAG(bool, loop_only, false, "measure the hand-made loop alone (for profiling)");
ABSL_FLAG(int, batch_size, 64, "positions per batch of the streaming pipeline");

namespace dtrain {
namespace {

// The job spec's data section a training rank would get (data.transforms as in kTransforms).
constexpr char kData[] = R"pb(
  shards {
    fields { name: "jpg" type: "image" }
    fields { name: "cls" type: "int" }
  }
)pb";

constexpr char kTransforms[] = R"pb(
  train { random_resized_crop { size: 224 } }
  train { random_horizontal_flip {} }
  train { to_tensor {} }
  train {
    normalize {
      mean: [ 0.485, 0.456, 0.406 ]
      std: [ 0.229, 0.224, 0.225 ]
    }
  }
)pb";

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "data_pipeline_bench: %s\n", message.c_str());
  std::exit(1);
}

// The process's CPU seconds (every thread's), for what a measurement used of the cores.
double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}
double cpu_seconds = 0;  // of the last Timed call

// Runs body(thread) on `threads` threads; returns the wall seconds until all finish.
double Timed(int threads, const std::function<void(int)>& body) {
  const double cpu = CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (std::thread& thread : pool) thread.join();
  cpu_seconds = CpuSeconds() - cpu;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// cpu_us_per_sample: every thread's CPU time over the samples, the cores' cost of one.
void Row(const std::string& system, int64_t samples, double seconds) {
  std::printf(
      "{\"system\": \"%s\", \"samples\": %lld, \"seconds\": %.3f, \"samples_per_s\": %.1f, "
      "\"cpu_us_per_sample\": %.1f}\n",
      system.c_str(), static_cast<long long>(samples), seconds, samples / seconds,
      cpu_seconds * 1e6 / static_cast<double>(samples));
  std::fflush(stdout);
}

// Every shard's samples, read and checked: the key, the JPEG and its label.
void ForEachSample(const std::string& shard,
                   const std::function<void(const std::string&, const std::string&)>& body) {
  absl::StatusOr<std::unique_ptr<TarShardReader>> reader = TarShardReader::Open(shard);
  if (!reader.ok()) Die(std::string(reader.status().message()));
  while (true) {
    absl::StatusOr<std::optional<ShardSample>> sample = (*reader)->Next();
    if (!sample.ok()) Die(std::string(sample.status().message()));
    if (!sample->has_value()) break;
    auto jpg = (*sample)->fields.find("jpg");
    if (jpg == (*sample)->fields.end() || (*sample)->fields.count("cls") == 0) {
      Die(absl::StrCat(shard, ": sample ", (*sample)->key, " lacks .jpg or .cls"));
    }
    body((*sample)->key, jpg->second);
  }
}

int Main() {
  // The pipeline allocates as a worker's rank does (its decoded batches, the samples in flight).
  if (absl::StatusOr<std::string> allocator = DescribeWorkerAllocator(); !allocator.ok()) {
    Die(std::string(allocator.status().message()));
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  std::vector<std::string> shards;
  for (const auto& entry : std::filesystem::directory_iterator(absl::GetFlag(FLAGS_shards))) {
    if (entry.path().extension() == ".tar") shards.push_back(entry.path().string());
  }
  std::sort(shards.begin(), shards.end());
  if (shards.empty()) Die("no .tar shards in --shards");
  // Pipeline threads are the parallelism; ATen's intra-op threads would oversubscribe the cores.
  at::set_num_threads(1);

  v1::DataTransforms spec;
  if (!google::protobuf::TextFormat::ParseFromString(kTransforms, &spec)) Die("bad transforms");
  absl::StatusOr<ImageTransformPipeline> pipeline = ImageTransformPipeline::Create(spec.train());
  if (!pipeline.ok()) Die(std::string(pipeline.status().message()));

  const bool pipeline_only = absl::GetFlag(FLAGS_pipeline_only);
  const bool loop_only = absl::GetFlag(FLAGS_loop_only);
  const bool profiling = pipeline_only || loop_only;
  // The ceiling's input: every JPEG in memory (read before the clock starts).
  std::vector<std::string> jpegs;
  for (const std::string& shard : profiling ? std::vector<std::string>{} : shards) {
    ForEachSample(shard, [&](const std::string&, const std::string& jpg) { jpegs.push_back(jpg); });
  }
  const int64_t n = static_cast<int64_t>(jpegs.size());

  // (a) libjpeg-turbo alone: TurboJPEG's decode to RGB with its defaults (accurate integer DCT,
  // fancy upsampling, what PIL does too).
  std::atomic<int64_t> decoded{0};
  double seconds = Timed(threads, [&](int t) {
    tjhandle handle = tjInitDecompress();
    std::vector<unsigned char> rgb;
    for (int64_t i = t; i < n; i += threads) {
      const auto* data = reinterpret_cast<const unsigned char*>(jpegs[i].data());
      int width, height, subsampling, colorspace;
      if (tjDecompressHeader3(handle, data, jpegs[i].size(), &width, &height, &subsampling,
                              &colorspace) != 0) {
        Die(tjGetErrorStr2(handle));
      }
      rgb.resize(static_cast<size_t>(width) * height * 3);
      if (tjDecompress2(handle, data, jpegs[i].size(), rgb.data(), width, 0, height, TJPF_RGB, 0) !=
          0) {
        Die(tjGetErrorStr2(handle));
      }
      ++decoded;
    }
    tjDestroy(handle);
  });
  if (!profiling) Row("libjpeg-turbo decode (ceiling)", decoded, seconds);

  // dtrain's DecodeImage alone, for what the wrapper costs over TurboJPEG.
  decoded = 0;
  seconds = Timed(threads, [&](int t) {
    for (int64_t i = t; i < n; i += threads) {
      if (!DecodeImage(jpegs[i]).ok()) Die("decode failed");
      ++decoded;
    }
  });
  if (!profiling) Row("dtrain DecodeImage", decoded, seconds);
  jpegs.clear();
  jpegs.shrink_to_fit();

  // (b) dtrain's streaming pipeline as a rank of a 1-rank job runs it: the shards' catalog,
  // the epoch's shard order and shuffle buffer (the spec's default, 1000), `threads` decode
  // threads a window of prefetch_batches (default 2) x batch ahead, collated batches.
  if (!loop_only) {
    v1::DataConfig data;
    if (!google::protobuf::TextFormat::ParseFromString(kData, &data)) Die("bad data spec");
    *data.mutable_transforms() = spec;
    data.set_num_workers(threads);
    const int batch = absl::GetFlag(FLAGS_batch_size);
    ShardedSplitOptions o;
    o.name = "train";
    absl::StatusOr<ShardCatalog> catalog =
        ResolveShards(absl::GetFlag(FLAGS_shards), "shards.train", {});
    if (!catalog.ok()) Die(std::string(catalog.status().message()));
    o.catalog = *std::move(catalog);
    o.training = true;
    o.seed = 1;
    o.shuffle_buffer = 1000;
    o.num_workers = threads;
    const int64_t window = std::max<int64_t>(2 * batch, 2 * threads);
    o.window = window;
    absl::StatusOr<SampleDecoder> decode = MakeSampleDecoder(data.shards().fields(), data, 1, true);
    if (!decode.ok()) Die(std::string(decode.status().message()));
    o.decode = *std::move(decode);
    o.keep_fields = {"jpg", "cls"};
    ShardedSplit split(std::move(o));
    split.SetRank(0, 1);
    const int64_t total = split.RankSamples();
    int64_t samples = 0;
    // Steady state: from the end of the first kStartBatches batches to the epoch's end. The
    // start is the shuffle buffer's first fill and the first touch of the batches' memory
    // (fresh pages are slow on a VM: clearing 3 batches of 38 MB was ~3% of this epoch), which a
    // training job pays once, not per batch.
    constexpr int kStartBatches = 3;
    std::chrono::steady_clock::time_point steady_start;
    double steady_cpu = 0;
    int64_t steady_samples = 0;
    int batches = 0;
    seconds = Timed(1, [&](int) {
      std::vector<int64_t> positions;
      for (int64_t p = 0; p < total; p += batch) {
        positions.clear();
        for (int64_t i = p; i < std::min<int64_t>(p + batch, total); ++i) positions.push_back(i);
        absl::StatusOr<c10::IValue> b = split.Batch(0, positions);
        if (!b.ok()) Die(std::string(b.status().message()));
        const at::Tensor images = b->toTuple()->elements()[0].toTensor();
        if (images.size(2) != 224 || images.size(3) != 224) Die("wrong batch shape");
        samples += images.size(0);
        if (++batches == kStartBatches) {
          steady_start = std::chrono::steady_clock::now();
          steady_cpu = CpuSeconds();
          steady_samples = samples;
        }
      }
    });
    if (samples != total) Die(absl::StrCat("read ", samples, " of ", total, " samples"));
    const double whole_cpu = cpu_seconds;
    if (samples - steady_samples > window) {
      // The window may hold decoded samples when the clock starts, and the epoch ends with it
      // empty: those are not counted, as if it had been full.
      cpu_seconds = CpuSeconds() - steady_cpu;
      Row("dtrain pipeline", samples - steady_samples - window,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - steady_start).count());
    }
    cpu_seconds = whole_cpu;
    Row("dtrain pipeline, whole epoch (start included)", samples, seconds);
    std::fprintf(stderr, "data_pipeline_bench: the step waited %.2f s of %.2f s for samples\n",
                 split.wait_seconds(), seconds);
  }
  if (pipeline_only) return 0;

  // The hand-made loops: tar reading, (fused) decode of the crop window, RandomResizedCrop(224),
  // flip, ToTensor, Normalize; shards split across the threads, no shuffle buffer or batches.
  for (bool fused : {true, false}) {
    if (loop_only && !fused) return 0;
    std::atomic<int64_t> samples{0};
    seconds = Timed(threads, [&](int t) {
      for (size_t s = t; s < shards.size(); s += threads) {
        ForEachSample(shards[s], [&](const std::string& key, const std::string& jpg) {
          SampleRandom rng(SampleSeed(0, 0, key));
          absl::StatusOr<at::Tensor> out;
          if (fused) {
            out = pipeline->DecodeAndApply(jpg, {}, rng);
          } else {
            absl::StatusOr<DecodedImage> image = DecodeImage(jpg);
            if (!image.ok()) Die(std::string(image.status().message()));
            out = pipeline->Apply(*std::move(image), rng);
          }
          if (!out.ok()) Die(std::string(out.status().message()));
          if (out->size(1) != 224 || out->size(2) != 224) Die("wrong output size");
          ++samples;
        });
      }
    });
    Row(fused ? "dtrain hand-made loop (no ShardedSplit)" : "dtrain hand-made loop, full decode",
        samples, seconds);
  }

  // A bound on any pipeline that gives the same output: the crop window's decode and the write
  // of a 3x224x224 float output into a batch-sized ring (38 MB, as a batch of 64), without the
  // resize's arithmetic.
  {
    std::atomic<int64_t> samples{0};
    seconds = Timed(threads, [&](int t) {
      constexpr size_t kOut = 3 * 224 * 224;
      std::vector<float> ring(64 * kOut);
      size_t slot = 0;
      for (size_t s = t; s < shards.size(); s += threads) {
        ForEachSample(shards[s], [&](const std::string& key, const std::string& jpg) {
          SampleRandom rng(SampleSeed(0, 0, key));
          absl::StatusOr<ImageHeader> header = ReadImageHeader(jpg, {});
          if (!header.ok()) Die(std::string(header.status().message()));
          const CropBox box = RandomResizedCropParams(header->height, header->width, 0.08, 1.0,
                                                      3.0 / 4.0, 4.0 / 3.0, rng);
          absl::StatusOr<DecodedImage> part =
              DecodeImageWindow(jpg, {box.top, box.left, box.height, box.width});
          if (!part.ok()) Die(std::string(part.status().message()));
          float* out = ring.data() + (slot++ % 64) * kOut;
          std::memset(out, part->pixels[0], kOut * sizeof(float));
          ++samples;
        });
      }
    });
    Row("bound: window decode + output write, no resize", samples, seconds);
  }
  return 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dtrain::Main();
}

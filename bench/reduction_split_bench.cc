// How the shm plane's split of a buffer between two ranks costs their in-place reduction: two
// threads pinned to two cores stand in for a 2-rank all_reduce of the MLP's gradient. Each step,
// each thread copies new gradients into its page-aligned buffer (the bucket's pack), both meet,
// each reduces its part of both buffers into both (the plane's ReduceInPlace), and both meet
// again. The part boundary is either the even split (count / 2, where the plane split before) or
// the plane's split on 64-byte lines (worker/collectives/reduction_partition.h); the two
// alternate in rounds, the order flipped each round, so that the machine's drift hits both.
// Both ranks start their reductions as they leave the same barrier, so the longer of the two in a
// step is what the closing barrier waits for. Prints, per split, each rank's median reduction and
// the median of the longer per step, in us, and the lines' over the even split's. One untimed
// round of each split first.
//   build/bench/dtrain-bench-reduction-split [--elements 203530] [--steps 2000] [--rounds 6]
//     [--cpus 0,1] [--evict_kib 4096]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/percentile.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/collectives/reduction_partition.h"
#include "worker/runtime/cpu_affinity.h"

ABSL_FLAG(int64_t, elements, 203530, "floats per rank's buffer (the MLP's whole gradient)");
ABSL_FLAG(int, steps, 2000, "steps per round and split");
ABSL_FLAG(int, rounds, 6, "rounds, each split once per round");
ABSL_FLAG(std::string, cpus, "0,1", "the two different cores the ranks' threads are pinned to");
ABSL_FLAG(int, evict_kib, 4096,
          "KiB each thread writes before its pack, a stand-in for forward and backward taking "
          "the cache (0: none)");

namespace {

using dtrain::bench::Percentile;

// Two ranks meeting: each on its own line, spinning as the plane's waits first do.
class SpinBarrier {
 public:
  void ArriveAndWait(int me) {
    const uint64_t n = ++mine_[me].value;
    arrived_[me * kStride].store(n, std::memory_order_release);
    while (arrived_[(1 - me) * kStride].load(std::memory_order_acquire) < n) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }

 private:
  static constexpr int kStride = 64 / sizeof(std::atomic<uint64_t>);
  alignas(64) std::atomic<uint64_t> arrived_[2 * kStride] = {};
  struct alignas(64) Count {
    uint64_t value = 0;
  };
  Count mine_[2];
};

struct Split {
  const char* name;
  bool on_lines;
  std::vector<double> reduce_us[2];  // per rank, every step
  std::vector<double> longer_us;     // per step, the longer of the ranks'
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_elements);
  const int steps = absl::GetFlag(FLAGS_steps), rounds = absl::GetFlag(FLAGS_rounds);
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_cpus), ',')) {
    int cpu = -1;
    if (!absl::SimpleAtoi(part, &cpu) || cpu < 0) {
      cpus.clear();
      break;
    }
    cpus.push_back(cpu);
  }
  const int64_t evict = int64_t{absl::GetFlag(FLAGS_evict_kib)} * 1024;
  if (n < 2 || steps < 1 || rounds < 1 || cpus.size() != 2 || cpus[0] == cpus[1] || evict < 0) {
    std::fprintf(
        stderr,
        "need --elements >= 2, --steps >= 1, --rounds >= 1, --cpus two different cores (a,b), "
        "--evict_kib >= 0\n");
    return 2;
  }
  // Page-aligned, as the plane's mappings are.
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 4095) / 4096 * 4096;
  float* buffers[2] = {static_cast<float*>(std::aligned_alloc(4096, bytes)),
                       static_cast<float*>(std::aligned_alloc(4096, bytes))};
  if (buffers[0] == nullptr || buffers[1] == nullptr) {
    std::fprintf(stderr, "cannot allocate 2 x %zu bytes\n", bytes);
    return 1;
  }
  Split splits[2] = {{"even split", false, {}, {}}, {"split on lines", true, {}, {}}};
  SpinBarrier barrier;
  std::vector<double> step_us[2];

  auto rank = [&](int me, Split& split) {
    // Unpinned, the two spinning threads may share a core and the numbers mean nothing: say so.
    if (absl::Status pinned = dtrain::PinCurrentThread({cpus[me]}); !pinned.ok()) {
      std::fprintf(stderr, "warning: rank %d not pinned: %s\n", me, pinned.ToString().c_str());
    }
    // Positive values whose mean stays put: no overflow or subnormals however many steps.
    std::vector<float> gradients(static_cast<size_t>(n), 1.0f + 0.5f * static_cast<float>(me));
    std::vector<char> other(static_cast<size_t>(evict));
    const auto [begin, end] = split.on_lines ? dtrain::ReductionPartOf(n, me, 2, 0, sizeof(float))
                                             : dtrain::ReductionPart{n * me / 2, n * (me + 1) / 2};
    const float* in[2] = {buffers[0] + begin, buffers[1] + begin};
    float* out[2] = {buffers[0] + begin, buffers[1] + begin};
    step_us[me].assign(static_cast<size_t>(steps), 0);
    for (int s = 0; s < steps; ++s) {
      for (int64_t i = 0; i < evict; i += 64) other[static_cast<size_t>(i)] += 1;
      std::memcpy(buffers[me], gradients.data(), static_cast<size_t>(n) * sizeof(float));
      barrier.ArriveAndWait(me);
      const auto start = std::chrono::steady_clock::now();
      dtrain::ReduceInRankOrder<float>(in, 2, out, 2, end - begin, dtrain::ReductionKind::kMean);
      step_us[me][static_cast<size_t>(s)] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      barrier.ArriveAndWait(me);
    }
  };

  // Round -1 warms both splits' code and caches and is not kept.
  for (int round = -1; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      Split& split = splits[(k + round + 2) % 2];
      std::thread peer(rank, 1, std::ref(split));
      rank(0, split);
      peer.join();
      if (round < 0) continue;
      for (int s = 0; s < steps; ++s) {
        for (int me = 0; me < 2; ++me) split.reduce_us[me].push_back(step_us[me][s]);
        split.longer_us.push_back(std::max(step_us[0][s], step_us[1][s]));
      }
    }
  }
  std::printf("%d rounds of %d steps per split, %lld floats, cores %d,%d (us, median)\n", rounds,
              steps, static_cast<long long>(n), cpus[0], cpus[1]);
  for (const Split& split : splits) {
    std::printf("%-15s rank 0 %6.1f  rank 1 %6.1f  longer of the two %6.1f\n", split.name,
                Percentile(split.reduce_us[0], 0.5), Percentile(split.reduce_us[1], 0.5),
                Percentile(split.longer_us, 0.5));
  }
  std::printf("longer of the two, lines over even: %.3f\n",
              Percentile(splits[1].longer_us, 0.5) / Percentile(splits[0].longer_us, 0.5));
  std::free(buffers[0]);
  std::free(buffers[1]);
  return 0;
}

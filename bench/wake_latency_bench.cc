// What a shm-plane rank pays for sleeping instead of polling: two threads pinned to two CPUs
// hand a turn back and forth as two ranks meet at a barrier. The waker computes for a while (a
// spin of 1.5-3.5 ms, as a rank that far behind its peer), then publishes the turn; the waiter
// either sleeps on a futex at once (the plane's wait once its 1 ms poll is over, woken by
// FUTEX_WAKE; sleeping at once rather than after a poll leaves its CPU idle longer, which if
// anything makes the wake-up slower) or polls with pause (the lockstep loops' wait). The latency
// is from the turn's store to the waiter seeing it; the waker's own FUTEX_WAKE call, which the
// last rank to arrive pays, is not in it. The two waits alternate in rounds, the order flipped
// each round, so that the machine's drift hits both. Prints, per wait, the mean, median, p90 and
// p99 of the latency in us, and the futex's extra over the poll's (mean and median): the mean
// extra times the sleeps a step (bench/wait_sleeps.sh) is the sleeps' expected cost a step.
//   build/bench/dtrain-bench-wake-latency [--handoffs 300] [--rounds 6] [--cpus 0,1]
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/percentile.h"
#include "worker/runtime/cpu_affinity.h"

ABSL_FLAG(int, handoffs, 300, "turns handed over per round and wait");
ABSL_FLAG(int, rounds, 6, "rounds, each wait once per round");
ABSL_FLAG(std::string, cpus, "0,1", "the two different CPUs the threads are pinned to");

namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The shared words, each on its own line as the plane's counters are.
struct alignas(64) Turn {
  std::atomic<uint32_t> value{0};
};
struct Shared {
  Turn turn;  // the waker's count: the waiter waits for it
  Turn ack;   // the waiter's count: the waker waits for it before its next busy spell
  alignas(64) std::atomic<int64_t> published_ns{0};
};

void Pin(int cpu) {
  if (absl::Status pinned = dtrain::PinCurrentThread({cpu}); !pinned.ok()) {
    std::fprintf(stderr, "cannot pin to CPU %d: %s\n", cpu, std::string(pinned.message()).c_str());
    std::exit(1);
  }
}

// One round of `handoffs` turns; returns the waiter's latencies in us.
std::vector<double> Round(bool futex, int handoffs, int waker_cpu, int waiter_cpu) {
  Shared shared;
  std::vector<double> latencies;
  latencies.reserve(handoffs);
  std::thread waker([&] {
    Pin(waker_cpu);
    for (uint32_t i = 1; i <= static_cast<uint32_t>(handoffs); ++i) {
      const int64_t until = NowNs() + 1'500'000 + (i % 5) * 500'000;
      while (NowNs() < until) Pause();
      shared.published_ns.store(NowNs(), std::memory_order_relaxed);
      shared.turn.value.store(i, std::memory_order_release);
      if (futex) {
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&shared.turn.value), FUTEX_WAKE, 1, nullptr,
                nullptr, 0);
      }
      while (shared.ack.value.load(std::memory_order_acquire) != i) Pause();
    }
  });
  Pin(waiter_cpu);
  for (uint32_t i = 1; i <= static_cast<uint32_t>(handoffs); ++i) {
    while (true) {
      const uint32_t seen = shared.turn.value.load(std::memory_order_acquire);
      if (seen == i) break;
      if (futex) {
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&shared.turn.value), FUTEX_WAIT, seen,
                nullptr, nullptr, 0);
      } else {
        Pause();
      }
    }
    latencies.push_back(
        static_cast<double>(NowNs() - shared.published_ns.load(std::memory_order_relaxed)) / 1e3);
    shared.ack.value.store(i, std::memory_order_release);
  }
  waker.join();
  return latencies;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::vector<int>> cpus = dtrain::CheckCpuList(absl::GetFlag(FLAGS_cpus));
  if (!cpus.ok() || cpus->size() != 2 || (*cpus)[0] == (*cpus)[1]) {
    std::fprintf(stderr, "--cpus takes two different CPUs, e.g. 0,1\n");
    return 2;
  }
  const int handoffs = absl::GetFlag(FLAGS_handoffs);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (handoffs < 1 || rounds < 1) {
    std::fprintf(stderr, "--handoffs and --rounds take a whole number >= 1\n");
    return 2;
  }
  std::vector<double> by_wait[2];  // 0: poll, 1: futex
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool futex = (round + k) % 2 == 1;
      std::vector<double> l = Round(futex, handoffs, (*cpus)[0], (*cpus)[1]);
      by_wait[futex].insert(by_wait[futex].end(), l.begin(), l.end());
    }
  }
  using dtrain::bench::Percentile;
  auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  const char* names[2] = {"poll", "futex"};
  for (int k = 0; k < 2; ++k) {
    std::printf(
        "{\"wait\": \"%s\", \"samples\": %zu, \"mean_us\": %.2f, \"median_us\": %.2f, "
        "\"p90_us\": %.2f, \"p99_us\": %.2f}\n",
        names[k], by_wait[k].size(), mean(by_wait[k]), Percentile(by_wait[k], 0.5),
        Percentile(by_wait[k], 0.9), Percentile(by_wait[k], 0.99));
  }
  std::printf("{\"futex_extra_mean_us\": %.2f, \"futex_extra_median_us\": %.2f}\n",
              mean(by_wait[1]) - mean(by_wait[0]),
              Percentile(by_wait[1], 0.5) - Percentile(by_wait[0], 0.5));
  return 0;
}

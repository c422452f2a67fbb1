// The compute limit for bench/training.sh: a plain single-process libtorch training loop over the
// same TorchScript zoo model, data path (Dataset::Batch of the same indices, the same
// normalization), optimizer and compute threads (SetComputeThreads on the thread that trains) as a
// dtrain worker's rank, pinned to the cores the local cluster gives that worker (--cpus), with no
// service and no communication around it, and the worker's allocator (jemalloc). Prints one JSON
// row:
// {"system", "model", "ranks", "batch", "threads", "samples_per_s", "start", "end", "barrier_s"}.
// --lockstep makes the ranks of one ceiling meet at a barrier after every step (a synchronous run
// with a free, instant all-reduce), and barrier_s is the time spent there. --rank/--world_size take
// the rank's slice of each global batch, as ddp does; --start_at (Unix seconds) starts every
// process of a ceiling at once, and start/end (Unix seconds) let the script compute their joint
// rate over the same interval dtrain's timer spans.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include <ATen/Parallel.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/plain_loop.h"
#include "common/process_tuning.h"
#include "worker/data/dataset.h"
#include "worker/runtime/worker_allocator.h"

ABSL_FLAG(std::string, model, "cnn", "mlp or cnn");
ABSL_FLAG(int, batch, 128, "samples per step");
ABSL_FLAG(int, steps, 100, "timed steps");
ABSL_FLAG(int, warmup, 10, "untimed steps first");
ABSL_FLAG(int, warm_process, 0,
          "steps on a throwaway model before the measured one is made (a worker daemon's "
          "process is warm from its earlier jobs: libraries initialized, heap grown)");
ABSL_FLAG(int, threads, 0, "libtorch threads (0: one per core)");
ABSL_FLAG(int, rank, 0, "this process's slice of each global batch");
ABSL_FLAG(int, world_size, 1, "processes sharing each global batch");
ABSL_FLAG(std::string, cpus, "", "pin the training thread to these cores, as a worker's --cpus");
ABSL_FLAG(double, start_at, 0, "Unix time to start training at (0: at once)");
ABSL_FLAG(bool, nesterov, false, "Nesterov momentum (the README demo's optimizer)");
ABSL_FLAG(double, lr, 0.05, "learning rate (a job spec's optimizer.lr)");
ABSL_FLAG(bool, shuffle, false,
          "each rank reads its batches from a shuffled order of the training set, as a job with "
          "data.shuffle does (a gather of scattered rows), instead of consecutive rows");
ABSL_FLAG(std::string, step_times, "",
          "if set, each timed step's duration in microseconds is written to this file, one per "
          "line (bench/training.sh pairs the ceiling's two ranks' steps)");

ABSL_FLAG(bool, print_allocator_env, false,
          "print the environment that gives another program the worker's allocator (NAME=value "
          "lines: LD_PRELOAD, MALLOC_CONF; bench/training.sh's torch peer) and exit");

ABSL_FLAG(std::string, lockstep, "",
          "if set, a file the ranks of one ceiling share: each step ends at a barrier there (a "
          "spin on shared counters, no data), so the ranks step together as ddp's all-reduce "
          "makes them, with a free and instant reduction");

namespace {

// The --lockstep barrier: one counter per rank, each on its own 64-byte line, in a file every
// process of the ceiling maps. A peer that died or never started fails the wait after a
// minute instead of spinning forever.
class LockstepBarrier {
 public:
  static constexpr int kMaxWorld = 4096 / 64;
  // The counters are shared between processes: only lock-free atomics are plain memory.
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  static absl::StatusOr<std::unique_ptr<LockstepBarrier>> Open(const std::string& path, int rank,
                                                               int world) {
    if (world < 1 || world > kMaxWorld || rank < 0 || rank >= world) {
      return absl::InvalidArgumentError("--lockstep needs 0 <= rank < world_size <= 64");
    }
    const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
    void* at = ftruncate(fd, 4096) == 0
                   ? mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
    const int error = errno;
    close(fd);
    if (at == MAP_FAILED) {
      return absl::InternalError(absl::StrCat("map ", path, ": ", strerror(error)));
    }
    auto barrier = std::unique_ptr<LockstepBarrier>(
        new LockstepBarrier(static_cast<std::atomic<uint64_t>*>(at), rank, world));
    // Only this rank writes its slot: a count there is a previous run's, whose counters would
    // let every wait pass at once and measure a free run instead.
    if (barrier->counts_[rank * 8].load() != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--lockstep: ", path, " holds a previous run's counters; remove it"));
    }
    return barrier;
  }
  ~LockstepBarrier() { munmap(counts_, 4096); }

  absl::Status ArriveAndWait() {
    ++arrivals_;
    counts_[rank_ * 8].store(arrivals_, std::memory_order_release);
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    for (int r = 0; r < world_; ++r) {
      for (int spins = 0; counts_[r * 8].load(std::memory_order_acquire) < arrivals_; ++spins) {
        if (spins % 4096 == 4095 && absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "--lockstep: rank ", r, " did not reach step ", arrivals_, " within a minute"));
        }
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
    }
    return absl::OkStatus();
  }

 private:
  LockstepBarrier(std::atomic<uint64_t>* counts, int rank, int world)
      : counts_(counts), rank_(rank), world_(world) {}
  std::atomic<uint64_t>* counts_;
  int rank_, world_;
  uint64_t arrivals_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_print_allocator_env)) {
    for (const std::string& line : dtrain::WorkerAllocatorEnvironment()) {
      std::printf("%s\n", line.c_str());
    }
    return 0;
  }
  // The worker's process settings (worker/main.cc); PrepareTrainingThread checks its allocator.
  dtrain::TuneLocking();
  if (absl::Status ready = dtrain::bench::PrepareTrainingThread(absl::GetFlag(FLAGS_threads),
                                                                absl::GetFlag(FLAGS_cpus));
      !ready.ok()) {
    std::fprintf(stderr, "--cpus: %s\n", ready.ToString().c_str());
    return 2;
  }
  dtrain::v1::DataConfig spec;
  spec.set_builtin("fashion-mnist");
  auto data = dtrain::Dataset::Load(spec);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const int64_t n = (*data)->Splits()[0].second;
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world_size);
  auto make = [&] {
    return dtrain::bench::PlainLoop::Make(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_lr), 0.9,
                                          absl::GetFlag(FLAGS_nesterov));
  };
  // --shuffle: one fixed permutation, read in windows, stands for a job's per-epoch shuffle.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (absl::GetFlag(FLAGS_shuffle)) std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  // `steps` steps of `loop`; the clock starts (into `start`) at step `timed_from`, and each
  // step from there on is timed on its own for --step_times.
  std::vector<double> step_us;
  absl::Duration waited;  // at the --lockstep barrier, over the timed steps
  std::unique_ptr<LockstepBarrier> lockstep;
  if (const std::string path = absl::GetFlag(FLAGS_lockstep); !path.empty()) {
    absl::StatusOr<std::unique_ptr<LockstepBarrier>> opened =
        LockstepBarrier::Open(path, rank, world);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
      return 1;
    }
    lockstep = *std::move(opened);
  }
  auto train = [&](dtrain::bench::PlainLoop& loop, int steps, int timed_from,
                   absl::Time& start) -> absl::Status {
    for (int step = 0; step < steps; ++step) {
      const absl::Time step_start = absl::Now();
      if (step == timed_from) start = step_start;
      std::vector<int64_t> indices(batch);
      // A new batch of consecutive samples each step, disjoint across the ranks of a ceiling.
      const int64_t first = (int64_t{step} * batch * world + int64_t{rank} * batch) % (n - batch);
      std::copy(order.begin() + first, order.begin() + first + batch, indices.begin());
      if (absl::Status stepped = loop.Step(**data, indices, step); !stepped.ok()) return stepped;
      if (lockstep != nullptr && timed_from >= 0) {
        const absl::Time arrived = absl::Now();
        if (absl::Status met = lockstep->ArriveAndWait(); !met.ok()) return met;
        if (step >= timed_from) waited += absl::Now() - arrived;
      }
      if (timed_from >= 0 && step >= timed_from) {
        step_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - step_start));
      }
    }
    return absl::OkStatus();
  };
  absl::Time start;
  absl::Status trained = absl::OkStatus();
  if (const int warm = absl::GetFlag(FLAGS_warm_process); warm > 0) {
    auto throwaway = make();
    trained = throwaway.ok() ? train(*throwaway, warm, -1, start) : throwaway.status();
  }
  auto measured = make();
  if (trained.ok() && !measured.ok()) trained = measured.status();
  if (trained.ok()) {
    const double start_at = absl::GetFlag(FLAGS_start_at);
    if (start_at > 0) {
      const absl::Duration wait = absl::FromUnixSeconds(0) + absl::Seconds(start_at) - absl::Now();
      // A late start would leave the ceiling's processes staggered and its joint rate low.
      if (wait < absl::ZeroDuration())
        std::fprintf(stderr, "warning: --start_at passed %s ago\n",
                     absl::FormatDuration(-wait).c_str());
      absl::SleepFor(wait);
    }
    trained = train(*measured, absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps),
                    absl::GetFlag(FLAGS_warmup), start);
  }
  if (!trained.ok()) {
    std::fprintf(stderr, "%s\n", trained.ToString().c_str());
    return 1;
  }
  const absl::Time end = absl::Now();
  if (const std::string path = absl::GetFlag(FLAGS_step_times); !path.empty()) {
    FILE* out = std::fopen(path.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "--step_times: cannot write %s\n", path.c_str());
      return 1;
    }
    for (double us : step_us) std::fprintf(out, "%.3f\n", us);
    std::fclose(out);
  }
  const double seconds = absl::ToDoubleSeconds(end - start);
  std::printf(
      "{\"system\": \"libtorch-loop\", \"model\": \"%s\", \"ranks\": 1, \"batch\": %d, "
      "\"threads\": %d, \"samples_per_s\": %.1f, \"samples\": %lld, \"start\": %.6f, "
      "\"end\": %.6f, \"barrier_s\": %.3f}\n",
      absl::GetFlag(FLAGS_model).c_str(), batch, at::get_num_threads(),
      absl::GetFlag(FLAGS_steps) * batch / seconds,
      static_cast<long long>(absl::GetFlag(FLAGS_steps)) * batch, absl::ToUnixMicros(start) / 1e6,
      absl::ToUnixMicros(end) / 1e6, absl::ToDoubleSeconds(waited));
  return 0;
}

// What fusing a ZeRO-1 optimizer update into the shm reduction could save on a small model: two
// ranks as two threads pinned to their own cores, a gradient bucket each (the MLP's 203,530
// floats by default), each variant's time per step over --steps steps (the slower rank's):
//   none      the baseline every variant pays: the bucket written (backward's stand-in), a barrier
//   separate  what a ddp rank does today: the shm plane's reduction of its half of the bucket
//             into both buckets (ReduceInRankOrder), a barrier, then SGD with momentum over all
//             its parameters (the ATen ops torch::optim::SGD runs)
//   fused     each rank reduces its half, applies SGD with momentum to that half while it is in
//             cache (momentum kept for that half only) and writes the new parameters into both
//             ranks' copies, then a barrier
//   whole     one barrier a step: each rank reduces every element into its own bucket
//             (alternating two bucket pairs so a peer may already fill the next), then SGD
//   partitioned  what ddp's split step does (trainer.split_optimizer_step, 2026-12-04): the
//             reduction of separate, then SGD in ATen's ops over this rank's half only and its
//             half of the parameters copied into the peer's copy, then a barrier
//   shared    as partitioned, with one copy of the parameters for both ranks (nothing copied)
//   fused_grads  fused, the mean also written into both buckets (the gradients kept as ddp's)
// It measures memory traffic and synchronization only: the fused arithmetic is not checked
// against torch's rounding, which a real fused update would have to match (partitioned runs
// ATen's own kernels). Prints one JSON row.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"

ABSL_FLAG(int64_t, elements, 203530, "parameters (the zoo MLP's count by default)");
ABSL_FLAG(int, steps, 3000, "timed steps per variant");
ABSL_FLAG(double, lr, 0.05, "learning rate");
ABSL_FLAG(double, momentum, 0.9, "momentum");

namespace {

// A sense-reversing spin barrier for two threads: the probe measures memory traffic, not the
// plane's futex.
class SpinBarrier {
 public:
  void ArriveAndWait(bool& sense) {
    sense = !sense;
    if (arrived_.fetch_add(1) == 1) {
      arrived_.store(0);
      sense_.store(sense, std::memory_order_release);
    } else {
      while (sense_.load(std::memory_order_acquire) != sense) {
      }
    }
  }

 private:
  std::atomic<int> arrived_{0};
  std::atomic<bool> sense_{false};
};

struct Shared {
  int64_t n;
  std::vector<float> grad[2][2], param[2];  // grad[pair][rank]
  SpinBarrier barrier;
  std::vector<double> micros[2];
};

// Stands in for backward: this rank's bucket rewritten (and so in its cache) every step.
void WriteGradients(float* g, int64_t n, int step, int rank) {
  const float v = 1e-3f * static_cast<float>((step + rank) % 7 + 1);
  for (int64_t i = 0; i < n; ++i) g[i] = v;
}

// SGD with momentum on one block, the new parameters written to both ranks' copies.
template <int64_t N>
inline void SgdBlock(float* __restrict buf, float* __restrict own, float* __restrict other,
                     const float* __restrict grad, int64_t n, float momentum, float lr) {
  const int64_t len = N > 0 ? N : n;
  for (int64_t i = 0; i < len; ++i) {
    const float next = buf[i] * momentum + grad[i];
    buf[i] = next;
    const float p = own[i] - lr * next;
    own[i] = p;
    other[i] = p;
  }
}

enum class Variant { kNone, kSeparate, kFused, kWhole, kPartitioned, kShared, kFusedGrads };
constexpr const char* kNames[] = {"none",        "separate", "fused",      "whole",
                                  "partitioned", "shared",   "fused_grads"};

void Rank(Shared& s, int rank, Variant variant) {
  // Unpinned, the two ranks may share a core and the numbers mean nothing: say so.
  if (absl::Status pinned = dtrain::PinCurrentThread({rank}); !pinned.ok())
    std::fprintf(stderr, "warning: rank %d not pinned: %s\n", rank, pinned.ToString().c_str());
  dtrain::SetComputeThreads(1);
  // Halves at n / 2, as the plane split until 2026-12-04 (it now moves the boundary to a cache
  // line: reduction_partition.h); these buffers are not page-aligned, so lines would differ per
  // buffer, and every variant here shares the split.
  const int64_t n = s.n, half = n / 2, begin = rank == 0 ? 0 : half, end = rank == 0 ? half : n;
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  const float momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  auto param = at::from_blob(s.param[rank].data(), {n});
  auto buffer = at::zeros({n});                      // momentum for every parameter
  std::vector<float> half_buffer(end - begin, 0.f);  // fused: momentum for this rank's half
  bool sense = false;
  const int steps = absl::GetFlag(FLAGS_steps);
  absl::Time start;
  for (int step = -100; step < steps; ++step) {  // 100 untimed steps first
    if (step == 0) start = absl::Now();
    // whole: the buckets alternate by step, so a rank may fill one while its peer still
    // reads the other; the others use the first pair only.
    std::vector<float>* grads = s.grad[variant == Variant::kWhole ? (step & 1) : 0];
    float* mine = grads[rank].data();
    WriteGradients(mine, n, step, rank);
    s.barrier.ArriveAndWait(sense);
    c10::NoGradGuard no_grad;
    switch (variant) {
      case Variant::kNone:
        s.barrier.ArriveAndWait(sense);
        break;
      case Variant::kSeparate: {
        const float* in[2] = {grads[0].data() + begin, grads[1].data() + begin};
        float* out[2] = {grads[0].data() + begin, grads[1].data() + begin};
        dtrain::ReduceInRankOrder<float>(in, 2, out, 2, end - begin, dtrain::ReductionKind::kMean);
        s.barrier.ArriveAndWait(sense);
        buffer.mul_(momentum).add_(at::from_blob(mine, {n}));
        param.add_(buffer, -lr);
        break;
      }
      case Variant::kWhole: {
        const float* in[2] = {grads[0].data(), grads[1].data()};
        float* out[1] = {mine};
        dtrain::ReduceInRankOrder<float>(in, 2, out, 1, n, dtrain::ReductionKind::kMean);
        buffer.mul_(momentum).add_(at::from_blob(mine, {n}));
        param.add_(buffer, -lr);
        break;
      }
      case Variant::kPartitioned:
      case Variant::kShared: {
        const float* in[2] = {grads[0].data() + begin, grads[1].data() + begin};
        float* out[2] = {grads[0].data() + begin, grads[1].data() + begin};
        dtrain::ReduceInRankOrder<float>(in, 2, out, 2, end - begin, dtrain::ReductionKind::kMean);
        const int owner = variant == Variant::kShared ? 0 : rank;
        auto p = at::from_blob(s.param[owner].data() + begin, {end - begin});
        auto b = at::from_blob(half_buffer.data(), {end - begin});
        b.mul_(momentum).add_(at::from_blob(mine + begin, {end - begin}));
        p.add_(b, -lr);
        if (variant == Variant::kPartitioned) {
          std::memcpy(s.param[1 - rank].data() + begin, s.param[rank].data() + begin,
                      (end - begin) * sizeof(float));
        }
        s.barrier.ArriveAndWait(sense);
        break;
      }
      case Variant::kFused:
      case Variant::kFusedGrads: {
        // 512 floats: the block stays in L1 between the passes, and a fixed trip count lets
        // the compiler vectorize at -O2 (as ReduceInRankOrder does).
        constexpr int64_t kBlock = 512;
        alignas(64) float mean[kBlock];
        for (int64_t b = begin; b < end; b += kBlock) {
          const int64_t count = std::min(kBlock, end - b);
          const float* block_in[2] = {grads[0].data() + b, grads[1].data() + b};
          float* block_out[2] = {mean, nullptr};
          const float* g = mean;
          if (variant == Variant::kFusedGrads) {
            block_out[0] = grads[0].data() + b;
            block_out[1] = grads[1].data() + b;
            g = grads[rank].data() + b;
          }
          dtrain::ReduceInRankOrder<float>(block_in, 2, block_out,
                                           variant == Variant::kFusedGrads ? 2 : 1, count,
                                           dtrain::ReductionKind::kMean);
          float* buf = half_buffer.data() + (b - begin);
          float* own = s.param[rank].data() + b;
          float* other = s.param[1 - rank].data() + b;
          if (count == kBlock) {
            SgdBlock<kBlock>(buf, own, other, g, count, momentum, lr);
          } else {
            SgdBlock<0>(buf, own, other, g, count, momentum, lr);
          }
        }
        // The peer's half of this rank's parameters must be in place before the next forward.
        s.barrier.ArriveAndWait(sense);
        break;
      }
    }
  }
  s.micros[rank].push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / steps);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf("{\"elements\": %lld", static_cast<long long>(absl::GetFlag(FLAGS_elements)));
  for (Variant variant : {Variant::kNone, Variant::kSeparate, Variant::kFused, Variant::kWhole,
                          Variant::kPartitioned, Variant::kShared, Variant::kFusedGrads}) {
    Shared s;
    s.n = absl::GetFlag(FLAGS_elements);
    for (int r = 0; r < 2; ++r) {
      s.grad[0][r].assign(s.n, 0.f);
      s.grad[1][r].assign(s.n, 0.f);
      s.param[r].assign(s.n, 0.5f);
    }
    std::thread t0(Rank, std::ref(s), 0, variant), t1(Rank, std::ref(s), 1, variant);
    t0.join();
    t1.join();
    std::printf(", \"%s_us\": %.1f", kNames[static_cast<int>(variant)],
                std::max(s.micros[0][0], s.micros[1][0]));
  }
  std::printf("}\n");
  return 0;
}

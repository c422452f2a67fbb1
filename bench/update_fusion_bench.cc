// What fusing a ZeRO-1 optimizer update into the shm reduction could save on a small model: two
// ranks as two threads pinned to their own cores, a gradient bucket each (the MLP's 203,530
// floats by default), timed per step from "both buckets written" to "both ranks hold the new
// parameters":
//   separate  what a ddp rank does today: the shm plane's reduction of its half of the bucket
//             into both buckets (ReduceInRankOrder), a barrier, then torch's SGD with momentum
//             over all its parameters (the ops torch::optim::SGD runs)
//   fused     each rank reduces its half, applies SGD with momentum to that half while it is in
//             cache (momentum kept for that half only) and writes the new parameters into both
//             ranks' copies, then one barrier
// It measures the memory traffic only: the fused arithmetic is not checked against torch's
// rounding here, which a real fused update would have to match. Prints one JSON row.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "worker/compute_threads.h"
#include "worker/cpu_affinity.h"
#include "worker/rank_order_reduction.h"

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
  std::vector<float> grad[2], param[2];
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

void Rank(Shared& s, int rank, bool fused) {
  (void)dtrain::PinCurrentThread({rank});
  dtrain::SetComputeThreads(1);
  const int64_t n = s.n, half = n / 2, begin = rank == 0 ? 0 : half, end = rank == 0 ? half : n;
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  const float momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  float* mine = s.grad[rank].data();
  auto param = at::from_blob(s.param[rank].data(), {n});
  auto grad = at::from_blob(mine, {n});
  auto buffer = at::zeros({n});                      // separate: momentum for every parameter
  std::vector<float> half_buffer(end - begin, 0.f);  // fused: momentum for this rank's half
  bool sense = false;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int step = -100; step < steps; ++step) {  // 100 untimed steps first
    WriteGradients(mine, n, step, rank);
    s.barrier.ArriveAndWait(sense);
    const absl::Time start = absl::Now();
    const float* in[2] = {s.grad[0].data() + begin, s.grad[1].data() + begin};
    if (!fused) {
      float* out[2] = {s.grad[0].data() + begin, s.grad[1].data() + begin};
      dtrain::ReduceInRankOrder<float>(in, 2, out, 2, end - begin, dtrain::ReductionKind::kMean);
      s.barrier.ArriveAndWait(sense);
      c10::NoGradGuard no_grad;
      buffer.mul_(momentum).add_(grad);
      param.add_(buffer, -lr);
    } else {
      // 512 floats: the block stays in L1 between the passes, and a fixed trip count lets
      // the compiler vectorize at -O2 (as ReduceInRankOrder does).
      constexpr int64_t kBlock = 512;
      alignas(64) float mean[kBlock];
      int64_t b = begin;
      for (; b + kBlock <= end; b += kBlock) {
        const float* block_in[2] = {s.grad[0].data() + b, s.grad[1].data() + b};
        float* block_out[1] = {mean};
        dtrain::ReduceInRankOrder<float>(block_in, 2, block_out, 1, kBlock,
                                         dtrain::ReductionKind::kMean);
        SgdBlock<kBlock>(half_buffer.data() + (b - begin), s.param[rank].data() + b,
                         s.param[1 - rank].data() + b, mean, kBlock, momentum, lr);
      }
      if (b < end) {
        const float* block_in[2] = {s.grad[0].data() + b, s.grad[1].data() + b};
        float* block_out[1] = {mean};
        dtrain::ReduceInRankOrder<float>(block_in, 2, block_out, 1, end - b,
                                         dtrain::ReductionKind::kMean);
        SgdBlock<0>(half_buffer.data() + (b - begin), s.param[rank].data() + b,
                    s.param[1 - rank].data() + b, mean, end - b, momentum, lr);
      }
    }
    s.barrier.ArriveAndWait(sense);
    if (step >= 0) s.micros[rank].push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf("{\"elements\": %lld", static_cast<long long>(absl::GetFlag(FLAGS_elements)));
  for (bool fused : {false, true}) {
    Shared s;
    s.n = absl::GetFlag(FLAGS_elements);
    for (int r = 0; r < 2; ++r) {
      s.grad[r].assign(s.n, 0.f);
      s.param[r].assign(s.n, 0.5f);
    }
    std::thread t0(Rank, std::ref(s), 0, fused), t1(Rank, std::ref(s), 1, fused);
    t0.join();
    t1.join();
    std::printf(", \"%s_us\": [%.1f, %.1f]", fused ? "fused" : "separate", Median(s.micros[0]),
                Median(s.micros[1]));
  }
  std::printf("}\n");
  return 0;
}

// The shm plane's reduction kernel (worker/collectives/rank_order_reduction.h) on one pinned
// core, against the same mean computed by the libtorch ops the kernel replaced (add_out, div_
// and a copy_ per output; here once over the whole buffer, where the replaced code ran them per
// 64K-element piece) and against memcpy between the same buffers (each output overwritten from
// another input: with --inputs equal to --outputs, the same bytes read and written, so a floor):
//   build/bench/dtrain-bench-reduction [--elements N] [--inputs 2] [--outputs 2] [--calls 2000]
// The default is the plane's case that matters most: a 2-rank mean of the MLP's half of its
// gradient (101,765 floats; the plane's parts are 101,776 and 101,754, split on cache lines)
// written back into both ranks' buffers. Both are in this core's cache: a best case, since in
// the plane the peer's half comes from the peer's core. The variants run
// in interleaved rounds, so that a slow stretch of the machine hits them all; each row gives the
// median over every call, the 10th percentile, the bytes it reads and writes per second, and its
// time over the kernel's mean. The libtorch ops' mean is compared bitwise with the kernel's
// before anything is timed, and a difference is reported.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "bench/percentile.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"

ABSL_FLAG(int64_t, elements, 101765, "elements per buffer (the MLP's half of its gradient)");
ABSL_FLAG(int, inputs, 2, "ranks reduced (2 to 8)");
ABSL_FLAG(int, outputs, 2, "buffers written, in place: the first `outputs` inputs (1 to inputs)");
ABSL_FLAG(int, calls, 2000, "timed calls per variant, a multiple of 10 (10 interleaved rounds)");
ABSL_FLAG(int, cpu, 0, "the core to pin to");

namespace {

using dtrain::bench::Percentile;

constexpr int kRounds = 10;

struct Variant {
  std::string name;
  std::function<void()> call;
  int64_t bytes;  // read and written per call
  std::vector<double> micros;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_elements);
  const int inputs = absl::GetFlag(FLAGS_inputs), outputs = absl::GetFlag(FLAGS_outputs);
  const int calls = absl::GetFlag(FLAGS_calls);
  if (n < 1 || inputs < 2 || inputs > 8 || outputs < 1 || outputs > inputs || calls < kRounds ||
      calls % kRounds != 0) {
    std::fprintf(stderr,
                 "need --elements >= 1, 2 <= --inputs <= 8, 1 <= --outputs <= --inputs, "
                 "--calls a positive multiple of %d\n",
                 kRounds);
    return 2;
  }
  // Unpinned, the thread may move between cores mid-call and the numbers mean nothing: say so.
  if (absl::Status pinned = dtrain::PinCurrentThread({absl::GetFlag(FLAGS_cpu)}); !pinned.ok())
    std::fprintf(stderr, "warning: not pinned: %s\n", pinned.ToString().c_str());
  dtrain::SetComputeThreads(1);
  c10::NoGradGuard no_grad;

  std::vector<at::Tensor> buffers;
  std::vector<const float*> in;
  std::vector<float*> out;
  for (int r = 0; r < inputs; ++r) {
    buffers.push_back(at::empty({n}));
    in.push_back(buffers.back().data_ptr<float>());
    if (r < outputs) out.push_back(buffers.back().data_ptr<float>());
  }
  // Positive values whose mean stays put: no overflow, no subnormals, whatever the call count
  // (a sum doubles each call in place and reaches infinity, which costs x86 nothing extra).
  auto refill = [&] {
    for (int r = 0; r < inputs; ++r) buffers[r].fill_(1.0 + 0.1 * r + 1e-3 * (r % 3));
  };
  at::Tensor acc = at::empty({n});
  const int64_t kernel_bytes = (inputs + outputs) * n * static_cast<int64_t>(sizeof(float));

  auto kernel = [&](dtrain::ReductionKind kind) {
    dtrain::ReduceInRankOrder<float>(in.data(), inputs, out.data(), outputs, n, kind);
  };
  auto torch_mean = [&] {
    at::add_out(acc, buffers[0], buffers[1]);
    for (int r = 2; r < inputs; ++r) acc.add_(buffers[r]);
    acc.div_(inputs);
    for (int k = 0; k < outputs; ++k) buffers[k].copy_(acc);
  };

  // The ops should compute what the kernel does; a run that shows otherwise says so.
  refill();
  kernel(dtrain::ReductionKind::kMean);
  std::vector<at::Tensor> want;
  for (int k = 0; k < outputs; ++k) want.push_back(buffers[k].clone());
  refill();
  torch_mean();
  for (int k = 0; k < outputs; ++k) {
    if (std::memcmp(want[k].data_ptr<float>(), out[k], n * sizeof(float)) != 0) {
      // Nothing promises that ATen's division by a scalar rounds as the kernel's does; where
      // it does not, only the speeds compare.
      std::fprintf(stderr, "note: libtorch's ops and the kernel differ in output %d\n", k);
      break;
    }
  }

  std::vector<Variant> variants;
  variants.push_back(
      {"kernel mean", [&] { kernel(dtrain::ReductionKind::kMean); }, kernel_bytes, {}});
  variants.push_back(
      {"kernel sum", [&] { kernel(dtrain::ReductionKind::kSum); }, kernel_bytes, {}});
  variants.push_back({"generic build mean",
                      [&] {
                        dtrain::ReduceInRankOrderGeneric<float>(in.data(), inputs, out.data(),
                                                                outputs, n,
                                                                dtrain::ReductionKind::kMean);
                      },
                      kernel_bytes,
                      {}});
  // Its bytes are the kernel's: what it moves beyond them is its cost.
  variants.push_back({"libtorch ops mean", torch_mean, kernel_bytes, {}});
  variants.push_back({inputs == outputs ? "memcpy floor" : "memcpy (not a floor)",
                      [&] {
                        for (int k = 0; k < outputs; ++k) {
                          std::memcpy(out[k], in[(k + 1) % inputs], n * sizeof(float));
                        }
                      },
                      2 * outputs * n * static_cast<int64_t>(sizeof(float)),
                      {}});

  for (int round = 0; round < kRounds; ++round) {
    for (Variant& v : variants) {
      refill();
      for (int i = 0; i < 20; ++i) v.call();  // in cache, as after backward
      for (int i = 0; i < calls / kRounds; ++i) {
        const absl::Time start = absl::Now();
        v.call();
        v.micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      }
    }
  }
  const double kernel_mean = Percentile(variants[0].micros, 0.5);
  std::printf("%d inputs into %d outputs in place, %lld floats each, %s build of the kernel\n",
              inputs, outputs, static_cast<long long>(n), dtrain::ReductionInstructionSet());
  std::printf("%-20s %10s %8s %7s %14s\n", "variant", "median us", "p10 us", "GB/s",
              "vs kernel mean");
  for (const Variant& v : variants) {
    const double median = Percentile(v.micros, 0.5);
    std::printf("%-20s %10.1f %8.1f %7.1f %13.2fx\n", v.name.c_str(), median,
                Percentile(v.micros, 0.1), static_cast<double>(v.bytes) / (median * 1e3),
                median / kernel_mean);
  }
  return 0;
}

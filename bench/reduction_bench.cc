// The shm plane's reduction kernel (worker/collectives/rank_order_reduction.h) on one pinned
// core, against the same mean composed of libtorch's ops (what the kernel replaced: add_out,
// div_ and a copy_ per output) and against plain copies of the same bytes (memcpy of each output
// from an input: the memory traffic's floor when inputs and outputs are as many):
//   build/bench/dtrain-bench-reduction [--elements N] [--inputs 2] [--outputs 2] [--calls 2000]
// The default is the plane's case that matters most: a 2-rank mean of the MLP's half of its
// gradient (101,765 floats) written back into both ranks' buffers, which are in cache as a
// rank's bucket is after backward. Variants run in interleaved rounds (so that a slow stretch of
// the machine hits them all); each row is the median over every call, with its 10th percentile,
// its rate in GB/s of bytes read and written, and its time over the kernel's mean.
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
#include "worker/collectives/rank_order_reduction.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"

ABSL_FLAG(int64_t, elements, 101765, "elements per buffer (the MLP's half of its gradient)");
ABSL_FLAG(int, inputs, 2, "ranks reduced (2 to 8)");
ABSL_FLAG(int, outputs, 2, "buffers written, in place: the first `outputs` inputs (1 to inputs)");
ABSL_FLAG(int, calls, 2000, "timed calls per variant, over 10 interleaved rounds");
ABSL_FLAG(int, cpu, 0, "the core to pin to");

namespace {

struct Variant {
  std::string name;
  std::function<void()> call;
  std::vector<double> micros;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_elements);
  const int inputs = absl::GetFlag(FLAGS_inputs), outputs = absl::GetFlag(FLAGS_outputs);
  const int calls = absl::GetFlag(FLAGS_calls);
  if (n < 1 || inputs < 2 || inputs > 8 || outputs < 1 || outputs > inputs || calls < 10) {
    std::fprintf(stderr,
                 "need --elements >= 1, 2 <= --inputs <= 8, 1 <= --outputs <= --inputs, "
                 "--calls >= 10\n");
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
    for (int r = 0; r < inputs; ++r) buffers[r].fill_(1.0 + 0.25 * r);
  };
  at::Tensor acc = at::empty({n});

  std::vector<Variant> variants;
  auto kernel = [&](dtrain::ReductionKind kind) {
    dtrain::ReduceInRankOrder<float>(in.data(), inputs, out.data(), outputs, n, kind);
  };
  variants.push_back({"kernel mean", [&] { kernel(dtrain::ReductionKind::kMean); }, {}});
  variants.push_back({"kernel sum", [&] { kernel(dtrain::ReductionKind::kSum); }, {}});
  variants.push_back({"generic build mean",
                      [&] {
                        dtrain::ReduceInRankOrderGeneric<float>(in.data(), inputs, out.data(),
                                                                outputs, n,
                                                                dtrain::ReductionKind::kMean);
                      },
                      {}});
  variants.push_back({"libtorch ops mean",
                      [&] {
                        at::add_out(acc, buffers[0], buffers[1]);
                        for (int r = 2; r < inputs; ++r) acc.add_(buffers[r]);
                        acc.div_(inputs);
                        for (int k = 0; k < outputs; ++k) buffers[k].copy_(acc);
                      },
                      {}});
  std::vector<float> scratch(static_cast<size_t>(n) * outputs);
  variants.push_back({"memcpy floor",
                      [&] {
                        // Reads as many inputs as it writes outputs: the traffic's floor only
                        // when --inputs equals --outputs.
                        for (int k = 0; k < outputs; ++k) {
                          std::memcpy(scratch.data() + k * n, in[k], n * sizeof(float));
                        }
                      },
                      {}});

  constexpr int kRounds = 10;
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
    const double copies = v.name == "memcpy floor" ? 2.0 * outputs : inputs + outputs;
    const double gbps = copies * static_cast<double>(n) * sizeof(float) / (median * 1e3);
    std::printf("%-20s %10.1f %8.1f %7.1f %13.2fx\n", v.name.c_str(), median,
                Percentile(v.micros, 0.1), gbps, median / kernel_mean);
  }
  return 0;
}

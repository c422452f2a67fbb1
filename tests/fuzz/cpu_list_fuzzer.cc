// libFuzzer target: Linux's cpu list syntax through ParseCpuList (worker/runtime/cpu_affinity.h),
// which a worker applies to its own --cpus and to the lists its peers on the host registered
// with the coordinator (--cpus=auto's split). A crash, a sanitizer report, an accepted list that
// is unsorted, has duplicates or a cpu out of range, or one whose shortest form
// (FormatCpuList) does not parse back to it is a finding. Built and run by tests/fuzz/run.sh.
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/runtime/cpu_affinity.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The coordinator keeps a peer's list to 256 bytes; longer inputs only repeat what these find.
  if (size > 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<int>> cpus = dtrain::ParseCpuList(text);
  if (!cpus.ok()) {
    if (cpus.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (cpus->empty() || !std::is_sorted(cpus->begin(), cpus->end()) ||
      std::adjacent_find(cpus->begin(), cpus->end()) != cpus->end() || cpus->front() < 0 ||
      cpus->back() >= CPU_SETSIZE) {
    std::abort();
  }
  absl::StatusOr<std::vector<int>> again = dtrain::ParseCpuList(dtrain::FormatCpuList(*cpus));
  if (!again.ok() || *again != *cpus) std::abort();
  return 0;
}

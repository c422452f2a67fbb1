// Pinning a worker's step thread to cores (--cpus). Two ranks on two cores, left to the
// scheduler, trade cores and lose caches; each pinned to its own core, the MLP's ddp step ran
// 10-15% faster. Pinning is opt-in (a launcher that knows the machine's layout assigns disjoint
// sets); without --cpus nothing is pinned. No libtorch here: the daemon's main includes it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Linux's cpu list syntax (taskset -c, Cpus_allowed_list): "0", "0-3", "0,2,4-5". Sorted,
// without duplicates. INVALID_ARGUMENT naming the part that is wrong.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text);

// The shortest list syntax for `cpus` (sorted): {0,1,2,5} -> "0-2,5".
std::string FormatCpuList(const std::vector<int>& cpus);

// The cpus this process may run on (sched_getaffinity).
absl::StatusOr<std::vector<int>> AllowedCpus();

// Parses `text` and checks that every cpu is one this process may run on; FAILED_PRECONDITION
// naming the ones it may not and those it may.
absl::StatusOr<std::vector<int>> CheckCpuList(absl::string_view text);

// Pins the calling thread (and the threads it starts later, which inherit its mask, such as
// OpenMP's) to `cpus`. Empty: nothing to do.
absl::Status PinCurrentThread(const std::vector<int>& cpus);

// The CPU time this process's cgroup may use, in cores: a CFS quota (cgroup v2's cpu.max, v1's
// cpu.cfs_quota_us over cpu.cfs_period_us), the smallest along the cgroup's path up to `root`;
// 0 when there is none or it cannot be read. Kubernetes without the static CPU manager policy
// limits a pod this way while its cpuset still holds every core of the node. `root` and
// `self_cgroup` are parameters for tests.
double CpuQuotaCores(const std::string& root = "/sys/fs/cgroup",
                     const std::string& self_cgroup = "/proc/self/cgroup");

// The cpus of local process `index` of `count` sharing `cpus` (ddp_spawn's children): equal
// contiguous slices when there are at least as many cpus as processes, else all of them.
std::vector<int> CpusOfLocalProcess(const std::vector<int>& cpus, int index, int count);

}  // namespace dtrain

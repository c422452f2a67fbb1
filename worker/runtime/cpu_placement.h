// Where a worker started without --cpus runs its steps (--cpus=auto, the default): the workers
// of one host that may use the same cores split them, each pinning its step thread to its own
// slice with one compute thread per core of it, as deploy/local/cluster.sh's --cpus does. Left
// to the scheduler, two workers on two cores with a thread per core each trained the zoo's MLP
// at 0.85x of its pinned rate (the CNN within noise; docs/BENCHMARKS.md, "The README demo").
//
// A worker learns of the others from the coordinator (RegisterWorkerResponse.same_host, and each
// heartbeat's answer); every auto worker computes the same split from the same list (slices in
// name order), so none has to ask another. A pure function here; WorkerService applies a new
// placement between jobs. No libtorch here.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// Another worker of this host, as the coordinator lists it.
struct LocalWorker {
  std::string name;
  std::vector<int> allowed;  // the cores its process may use
  std::vector<int> pinned;   // its steps' cores; empty: not pinned
  bool automatic = false;    // it places itself too (--cpus=auto)
};

struct CpuPlacement {
  std::vector<int> cpus;  // the step thread's cores; empty: not pinned
  int threads = 1;        // libtorch compute threads
  // Why, in a sentence for the log ("2 workers share cores 0-1: this one takes 1").
  std::string reason;
  // Steps will share cores with another worker's: the log says so as a warning.
  bool shared = false;

  bool operator==(const CpuPlacement& o) const { return cpus == o.cpus && threads == o.threads; }
  bool operator!=(const CpuPlacement& o) const { return !(*this == o); }
};

// The placement of worker `self` whose process may use `allowed` (sorted), given the other
// workers of its host. `threads` is --threads (0: one per core of the slice; more than the
// slice has is lowered to it). Workers whose cores do not meet `allowed` are ignored; cores
// another worker was pinned to by hand (--cpus=<list>) are left to it; the remaining cores are
// split between the auto workers in equal contiguous slices, in name order. With fewer cores
// than auto workers, nothing is pinned and each runs one thread. `quota_cores` (CpuQuotaCores;
// 0: none) caps the threads at the whole cores the cgroup may use.
CpuPlacement PlaceSteps(const std::string& self, const std::vector<int>& allowed, int threads,
                        const std::vector<LocalWorker>& others, double quota_cores = 0);

}  // namespace dtrain

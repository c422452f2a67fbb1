#include "worker/runtime/cpu_placement.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "worker/runtime/cpu_affinity.h"

namespace dtrain {
namespace {

bool Meets(const std::vector<int>& a, const std::vector<int>& b) {
  return std::any_of(a.begin(), a.end(),
                     [&](int cpu) { return std::binary_search(b.begin(), b.end(), cpu); });
}

}  // namespace

CpuPlacement PlaceSteps(const std::string& self, const std::vector<int>& allowed, int threads,
                        const std::vector<LocalWorker>& others, double quota_cores) {
  CpuPlacement placement;
  std::vector<int> taken;  // cores pinned by hand to other workers
  std::vector<std::string> autos = {self};
  int floating = 0;  // other workers on these cores that are not pinned at all
  for (const LocalWorker& other : others) {
    if (other.name == self || !Meets(other.allowed, allowed)) continue;
    if (other.automatic) {
      autos.push_back(other.name);
    } else if (!other.pinned.empty()) {
      taken.insert(taken.end(), other.pinned.begin(), other.pinned.end());
    } else {
      ++floating;
    }
  }
  std::sort(taken.begin(), taken.end());
  std::vector<int> free;
  std::set_difference(allowed.begin(), allowed.end(), taken.begin(), taken.end(),
                      std::back_inserter(free));
  std::sort(autos.begin(), autos.end());
  autos.erase(std::unique(autos.begin(), autos.end()), autos.end());
  const int count = static_cast<int>(autos.size());
  const int index = static_cast<int>(std::find(autos.begin(), autos.end(), self) - autos.begin());
  const std::string here = absl::StrCat(
      count == 1 ? "the only auto-placed worker" : absl::StrCat(count, " auto-placed workers"),
      " on cores ", FormatCpuList(free.empty() ? allowed : free),
      taken.empty() ? "" : absl::StrCat(" (", FormatCpuList(taken), " pinned to others by hand)"));
  if (static_cast<int>(free.size()) < count) {
    placement.threads = 1;
    placement.shared = true;
    placement.reason =
        absl::StrCat(here,
                     ": fewer cores than workers, so steps are not pinned and run 1 thread each; "
                     "give this host fewer workers or more cores");
    return placement;
  }
  placement.cpus = CpusOfLocalProcess(free, index, count);
  const int cores = static_cast<int>(placement.cpus.size());
  placement.threads = threads > 0 ? std::min(threads, cores) : cores;
  std::string quota;
  if (quota_cores > 0 && quota_cores < placement.threads) {
    // More threads than the quota lets run at once would be throttled in turns.
    placement.threads = std::max(1, static_cast<int>(quota_cores));
    quota = absl::StrCat(" (the cgroup's CPU quota is ", quota_cores, " cores)");
  }
  placement.shared = floating > 0;
  placement.reason = absl::StrCat(
      here, ": this one takes ", FormatCpuList(placement.cpus), " with ", placement.threads,
      " thread(s)", quota,
      floating > 0 ? absl::StrCat("; ", floating,
                                  " other worker(s) here run unpinned (--cpus=none) and may "
                                  "share these cores")
                   : "");
  return placement;
}

}  // namespace dtrain

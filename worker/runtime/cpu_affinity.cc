// Cpu lists, thread pinning and the cgroup's CPU quota; see cpu_affinity.h. The list parser is
// hand-written (twenty lines) rather than taken from libnuma, which the worker would link for this
// alone.
#include "worker/runtime/cpu_affinity.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dtrain {
namespace {

constexpr int kMaxCpu = CPU_SETSIZE - 1;

absl::StatusOr<int> ParseCpu(absl::string_view text, absl::string_view whole) {
  int cpu = -1;
  if (!absl::SimpleAtoi(text, &cpu) || cpu < 0 || cpu > kMaxCpu ||
      text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("cpu list '", whole, "': '", text,
                                                   "' is not a cpu number in [0, ", kMaxCpu,
                                                   "] (write e.g. 0-3,6)"));
  }
  return cpu;
}

// The first line of a small kernel file ("" when it cannot be read): cgroup files only.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line.size() > 4096) return "";
  return line;
}

// Cores of one cgroup directory's quota; 0 when it has none.
double QuotaOf(const std::string& dir, bool v2) {
  double quota = 0, period = 0;
  if (v2) {
    // "max 100000" or "150000 100000"
    std::vector<std::string> parts = absl::StrSplit(FirstLine(dir + "/cpu.max"), ' ');
    if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &quota) ||
        !absl::SimpleAtod(parts[1], &period)) {
      return 0;
    }
  } else if (!absl::SimpleAtod(FirstLine(dir + "/cpu.cfs_quota_us"), &quota) ||
             !absl::SimpleAtod(FirstLine(dir + "/cpu.cfs_period_us"), &period)) {
    return 0;
  }
  return quota > 0 && period > 0 ? quota / period : 0;  // v1's -1: none
}

}  // namespace

double CpuQuotaCores(const std::string& root, const std::string& self_cgroup) {
  std::ifstream in(self_cgroup);
  std::string line;
  std::string v2_path, v1_path;
  bool has_v1_cpu = false;
  for (int n = 0; n < 64 && std::getline(in, line); ++n) {
    // "0::/path" (v2), "4:cpu,cpuacct:/path" (v1)
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) v2_path = fields[2];
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "cpu") {
        has_v1_cpu = true;
        v1_path = fields[2];
      }
    }
  }
  // v1's cpu controller where it is mounted (a hybrid host has both); else the unified tree.
  const bool v2 = !has_v1_cpu;
  std::string base = root;
  if (!v2) {
    for (const char* mount : {"/cpu,cpuacct", "/cpu"}) {
      if (!FirstLine(root + mount + "/cpu.cfs_period_us").empty()) {
        base = root + mount;
        break;
      }
    }
  }
  std::string path = v2 ? v2_path : v1_path;
  if (path.find("..") != std::string::npos) return 0;
  double smallest = 0;
  // The cgroup and each of its parents, up to the root of the tree this process sees.
  for (int depth = 0; depth < 64; ++depth) {
    const double cores = QuotaOf(base + (path == "/" ? "" : path), v2);
    if (cores > 0 && (smallest == 0 || cores < smallest)) smallest = cores;
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return smallest;
}

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("the cpu list is empty (write e.g. 0-3,6)");
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    absl::StatusOr<int> low = ParseCpu(ends[0], text);
    if (!low.ok()) return low.status();
    int high = *low;
    if (ends.size() == 2) {
      absl::StatusOr<int> h = ParseCpu(ends[1], text);
      if (!h.ok()) return h.status();
      if (*h < *low) {
        return absl::InvalidArgumentError(
            absl::StrCat("cpu list '", text, "': the range '", part, "' runs backwards"));
      }
      high = *h;
    }
    for (int c = *low; c <= high; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

absl::StatusOr<std::vector<int>> CheckCpuList(absl::string_view text) {
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(text);
  if (!cpus.ok()) return cpus.status();
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  if (!allowed.ok()) return allowed.status();
  std::vector<int> missing;
  std::set_difference(cpus->begin(), cpus->end(), allowed->begin(), allowed->end(),
                      std::back_inserter(missing));
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cpu list '", text, "': this process may not run on cpu(s) ",
                     FormatCpuList(missing), "; it may run on ", FormatCpuList(*allowed)));
  }
  return cpus;
}

absl::Status PinCurrentThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::OkStatus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c > kMaxCpu) return absl::InvalidArgumentError(absl::StrCat("no cpu ", c));
    CPU_SET(c, &set);
  }
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot pin this thread to cpus ", FormatCpuList(cpus), ": ", std::strerror(rc)));
  }
  return absl::OkStatus();
}

std::vector<int> CpusOfLocalProcess(const std::vector<int>& cpus, int index, int count) {
  if (count <= 0 || index < 0 || index >= count || static_cast<int>(cpus.size()) < count) {
    return cpus;
  }
  const size_t per = cpus.size() / count;
  return std::vector<int>(cpus.begin() + index * per, cpus.begin() + (index + 1) * per);
}

}  // namespace dtrain

// Cpu lists and thread pinning; see cpu_affinity.h. The list parser is hand-written (twenty
// lines) rather than taken from libnuma, which the worker would link for this alone.
#include "worker/runtime/cpu_affinity.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

}  // namespace

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

// The worker's jemalloc options, given to jemalloc through its malloc_conf symbol, and read back.
#include "worker/runtime/worker_allocator.h"

#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <jemalloc/jemalloc.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// jemalloc reads this at its first allocation, before main. libjemalloc.so defines the symbol
// too and reads it through the dynamic linker, which finds the executable's definition first
// (ld exports it from the executable because a linked shared library defines it). This object
// is linked into every program that calls the functions below, which the worker and the benches
// do.
const char* malloc_conf = dtrain::kWorkerAllocatorOptions;

namespace dtrain {
namespace {

absl::Status MallctlError(absl::string_view name, int error) {
  return absl::InternalError(
      absl::StrCat("jemalloc's mallctl(\"", name, "\"): ", std::strerror(error)));
}

template <typename T>
absl::StatusOr<T> Read(const char* name) {
  T value{};
  size_t size = sizeof(value);
  if (const int error = mallctl(name, &value, &size, nullptr, 0); error != 0) {
    return MallctlError(name, error);
  }
  return value;
}

// Where jemalloc takes options from besides malloc_conf (later ones override earlier ones).
std::string OptionSources() {
  std::string sources;
  char target[256];
  if (readlink("/etc/malloc.conf", target, sizeof(target)) > 0) sources = "/etc/malloc.conf";
  if (const char* environment = std::getenv("MALLOC_CONF"); environment != nullptr) {
    absl::StrAppend(&sources, sources.empty() ? "" : " and ", "MALLOC_CONF=", environment);
  }
  return sources;
}

}  // namespace

absl::StatusOr<std::string> DescribeWorkerAllocator() {
  // The malloc every library of this process calls: the first definition in load order, which
  // an LD_PRELOAD of another allocator would take.
  void* used = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info origin{};
  if (used == nullptr || dladdr(used, &origin) == 0 || origin.dli_fname == nullptr ||
      !absl::StrContains(origin.dli_fname, "jemalloc")) {
    // The usual cause is a preload; naming it lets the user see which one to remove.
    const char* preload = std::getenv("LD_PRELOAD");
    return absl::FailedPreconditionError(absl::StrCat(
        "malloc is ", origin.dli_fname != nullptr ? origin.dli_fname : "of an unknown library",
        ", not jemalloc",
        preload != nullptr ? absl::StrCat(" (LD_PRELOAD=", preload, " replaces it: unset it)")
                           : " (is another allocator preloaded, e.g. by /etc/ld.so.preload?)",
        ": the worker's memory is not bounded as docs/data.md states"));
  }
  absl::StatusOr<const char*> version = Read<const char*>("version");
  absl::StatusOr<size_t> oversize = Read<size_t>("opt.oversize_threshold");
  absl::StatusOr<ssize_t> decay = Read<ssize_t>("opt.dirty_decay_ms");
  for (const absl::Status& s : {version.status(), oversize.status(), decay.status()}) {
    if (!s.ok()) return s;
  }
  const std::string options =
      absl::StrCat("oversize_threshold:", *oversize, ",dirty_decay_ms:", *decay);
  // Any other option (narenas, tcache...) changes the allocator the figures were measured with
  // as well, and cannot all be read back: any source besides malloc_conf is reported.
  const std::string sources = OptionSources();
  if (options != kWorkerAllocatorOptions || !sources.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "jemalloc runs with ", options, (sources.empty() ? "" : " and the options of "), sources,
        ", not the worker's ", kWorkerAllocatorOptions,
        " alone: its memory and step rate are not the measured ones (docs/data.md); remove ",
        (sources.empty() ? "what sets them" : sources), " to run as measured"));
  }
  return absl::StrCat("jemalloc ", *version, " (", options, ")");
}

absl::Status ReturnFreedMemory() {
  const std::string purge = absl::StrCat("arena.", MALLCTL_ARENAS_ALL, ".purge");
  if (const int error = mallctl(purge.c_str(), nullptr, nullptr, nullptr, 0); error != 0) {
    return MallctlError(purge, error);
  }
  return absl::OkStatus();
}

}  // namespace dtrain

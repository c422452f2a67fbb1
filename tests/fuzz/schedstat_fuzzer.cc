// libFuzzer target: a thread's scheduler statistics as /proc/thread-self/schedstat gives them
// (common/thread_schedstat.h), which the worker reads at every training call. A crash, a
// sanitizer report, a negative count, or a parse that succeeds on text that is not three
// decimal counts is a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/thread_schedstat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dtrain::ThreadSchedstat> parsed = dtrain::ParseSchedstat(text);
  if (!parsed.ok()) return 0;
  if (parsed->on_cpu_ns < 0 || parsed->run_queue_ns < 0 || parsed->slices < 0) std::abort();
  // Accepted text is digits and two spaces, with at most a newline at the end.
  std::string_view body = text;
  if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  int spaces = 0;
  for (char c : body) {
    if (c == ' ') {
      ++spaces;
    } else if (c < '0' || c > '9') {
      std::abort();
    }
  }
  if (spaces != 2) std::abort();
  return 0;
}

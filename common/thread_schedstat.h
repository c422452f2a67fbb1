// Linux's scheduler statistics for one thread (/proc/thread-self/schedstat): its time on a CPU
// and its time runnable but waiting for one. The second is what other threads and processes on
// the same cores take from a thread that would run: a worker reports it for its step thread in
// every training call, so that a job's log says when the ranks' cores are shared (the cost of a
// core shared with a service's own threads, another worker or another job, which no phase of a
// step shows by itself).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace dtrain {

struct ThreadSchedstat {
  int64_t on_cpu_ns = 0;     // running
  int64_t run_queue_ns = 0;  // runnable, waiting for a CPU another thread held
  int64_t slices = 0;        // times it ran
};

// The file's text: three decimal counts separated by single spaces, an optional newline at the
// end. Anything else (fewer or more fields, signs, a count over int64) is InvalidArgument: the
// kernel's format is checked, not trusted.
absl::StatusOr<ThreadSchedstat> ParseSchedstat(std::string_view text);

// The calling thread's. Unavailable where the kernel keeps none (not Linux, or a kernel built
// without CONFIG_SCHED_INFO): callers then report nothing rather than a zero.
absl::StatusOr<ThreadSchedstat> ThisThreadSchedstat();

}  // namespace dtrain

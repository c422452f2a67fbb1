// Process-wide settings for dtrain's own binaries (never called from the library: a library
// must not change its host program's allocator or locking policy). Users' programs may call them.
//
// Locking: Debian's Abseil is built with Mutex deadlock detection on, a debugging aid that
// builds a lock graph on every lock; it was ~8% of all CPU in a barrier loop (gRPC locks
// absl::Mutex internally). Off here.
//
// Malloc: tensor payloads are megabytes that are allocated and freed on every collective. With
// glibc's defaults each such buffer is a fresh mmap whose pages fault in on first touch, which
// measured 2.4x slower on a 1 MiB all_reduce. Keeping them on the heap makes them reusable;
// the coordinator gives idle memory back with malloc_trim when traffic pauses.
#pragma once

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace dtrain {

// One glibc allocator setting, for the processes that allocate with glibc's malloc: the
// coordinator, the CLI and the benches' clients. The worker allocates with jemalloc
// (worker/runtime/worker_allocator.h).
struct MallocSetting {
  int parameter;
  const char* name;
  int value;
};

// In the order they are made.
inline constexpr MallocSetting kMallocSettings[] = {
    {M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", 256 << 20},
    {M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", 512 << 20},
    // Few arenas keep freed memory in few places, where malloc_trim can find it.
    {M_ARENA_MAX, "M_ARENA_MAX", 2},
};

// For every dtrain binary.
inline void TuneLocking() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

// For the binaries that allocate with glibc's malloc.
inline void TuneProcessForDtrain() {
  TuneLocking();
  for (const MallocSetting& setting : kMallocSettings) mallopt(setting.parameter, setting.value);
}

}  // namespace dtrain

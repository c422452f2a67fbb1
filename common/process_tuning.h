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

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

// One allocator setting: the mallopt parameter, and the glibc environment variable that makes
// the same setting in a program that does not call mallopt (bench/training.sh starts torch's
// ranks so, for a like-for-like peer; it reads the values from here, through
// `dtrain-bench-train-loop --print_malloc_env`, so the two cannot drift apart).
struct MallocSetting {
  int parameter;
  const char* environment_variable;
  int value;
  bool training_only;  // made by TuneProcessForTraining alone
};

// In the order they are made.
inline constexpr MallocSetting kMallocSettings[] = {
    {M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 256 << 20, false},
    {M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 512 << 20, false},
    // Few arenas keep freed memory in few places, where malloc_trim can find it.
    {M_ARENA_MAX, "MALLOC_ARENA_MAX", 2, false},
    // For a process whose threads train (the worker; the bench's compute ceiling). A thread
    // other than main allocates from an arena made of 64 MiB heaps, and glibc unmaps a heap the
    // moment it is empty unless the heap before it has less free room than M_TOP_PAD, whatever
    // M_TRIM_THRESHOLD says. A training step whose tensors spilled over into a new heap then
    // mapped, faulted in and unmapped it on every step: 1.0-2.1 M page faults in a 1,200-step
    // job, that rank's steps 2-3x slower. A spill happens when the heap before has less room
    // than the step's next tensor (a few MiB): 8 MiB kept the jobs measured free of it. A whole
    // heap's worth (64 MiB) would keep every emptied heap for good, since malloc_trim cannot give
    // back a non-main arena's top. Not for the coordinator, whose idle trim should give memory
    // back.
    {M_TOP_PAD, "MALLOC_TOP_PAD_", 8 << 20, true},
};

inline void TuneProcessForDtrain() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  for (const MallocSetting& setting : kMallocSettings) {
    if (!setting.training_only) mallopt(setting.parameter, setting.value);
  }
}

// For processes whose threads train: their per-step tensors must stay in the heaps they came from.
inline void TuneProcessForTraining() {
  TuneProcessForDtrain();
  for (const MallocSetting& setting : kMallocSettings) {
    if (setting.training_only) mallopt(setting.parameter, setting.value);
  }
}

// TuneProcessForTraining's allocator settings as glibc's environment: one NAME=value per line.
inline std::string TrainingMallocEnvironment() {
  std::string lines;
  for (const MallocSetting& setting : kMallocSettings) {
    absl::StrAppend(&lines, setting.environment_variable, "=", setting.value, "\n");
  }
  return lines;
}

}  // namespace dtrain

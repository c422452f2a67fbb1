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

inline void TuneProcessForDtrain() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // Few arenas keep freed memory in few places, where malloc_trim can find it.
  mallopt(M_ARENA_MAX, 2);
}

// For a process whose threads train (the worker; the bench's compute ceiling): the settings
// above, and one more. A thread other than main allocates from an
// arena made of 64 MiB heaps, and glibc unmaps a heap the moment it is empty unless the heap
// before it has less free room than M_TOP_PAD, whatever M_TRIM_THRESHOLD says. A training step
// whose tensors spilled over into a new heap then mapped, faulted in and unmapped it on every
// step: 1.0-2.1 M page faults in a 1,200-step job, that rank's steps 2-3x slower. A spill
// happens when the heap before has less room than the step's next tensor (a few MiB): 8 MiB kept
// the jobs measured free of it. A whole heap's worth (64 MiB) would keep every emptied heap for
// good, since malloc_trim cannot give back a non-main arena's top. Not for the coordinator,
// whose idle trim should give memory back.
inline void TuneProcessForTraining() {
  TuneProcessForDtrain();
  mallopt(M_TOP_PAD, 8 << 20);
}

}  // namespace dtrain

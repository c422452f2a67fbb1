// The worker's memory allocator: jemalloc, linked into dtrain-worker in place of glibc's malloc,
// and into the benches' plain loops, which must allocate as a worker does. With glibc's malloc,
// memory that a streaming job's threads freed stayed resident in the heaps they share, so a
// worker's peak grew with the dataset (docs/decisions/performance.md, "The worker allocates with
// jemalloc"). This header is plain C++ and names no jemalloc symbol: a program that only starts
// others with the worker's allocator (a test, a bench script's helper) includes it without
// linking jemalloc; DescribeWorkerAllocator needs dtrain_worker_allocator.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

#ifndef DTRAIN_JEMALLOC_LIBRARY
#error "link dtrain_worker_allocator_options (worker/runtime/CMakeLists.txt): it names the jemalloc"
#endif

namespace dtrain {

// The worker's jemalloc options (its malloc_conf; MALLOC_CONF in the environment overrides them).
//   oversize_threshold:0  jemalloc's default gives blocks of 8 MiB and up an arena of their own
//                         whose freed pages go back to the kernel at once; a CNN's activations
//                         and gradients are such blocks, so every step faulted them in again
//                         (4 million page faults in a 1-epoch demo job, 0.71x its rate).
//   dirty_decay_ms:-1     freed pages stay with the process for the next step: with any decay
//                         time (10 s, jemalloc's default, and 60 s measured) the ceiling's CNN
//                         loop took 2-4 million page faults in 430 steps and ran at 0.77-0.88x.
//                         They go back when the worker is left without a job
//                         (ReturnFreedMemory), as the coordinator's malloc_trim gives glibc's
//                         back when its traffic pauses.
inline constexpr char kWorkerAllocatorOptions[] = "oversize_threshold:0,dirty_decay_ms:-1";

// The environment that gives another program the worker's allocator: LD_PRELOAD of the jemalloc
// the worker links, and MALLOC_CONF (bench/training.sh's torch peer runs with it).
inline std::vector<std::string> WorkerAllocatorEnvironment() {
  return {std::string("LD_PRELOAD=") + DTRAIN_JEMALLOC_LIBRARY,
          std::string("MALLOC_CONF=") + kWorkerAllocatorOptions};
}

// "jemalloc <version> (<options>)", read back from this process's allocator. An error saying
// what differs when malloc is not jemalloc's (another allocator preloaded), its options are not
// kWorkerAllocatorOptions, or options come from elsewhere too (MALLOC_CONF, /etc/malloc.conf).
absl::StatusOr<std::string> DescribeWorkerAllocator();

// Gives the pages jemalloc keeps for reuse (all of its arenas') back to the kernel: for an idle
// worker, after a job, since with dirty_decay_ms:-1 jemalloc never does it by itself.
absl::Status ReturnFreedMemory();

}  // namespace dtrain

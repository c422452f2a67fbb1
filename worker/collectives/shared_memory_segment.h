// The layout of the shm plane's segment, shared by its two halves: the segment itself (set-up,
// arrivals and waits, matching calls, poisoning, shared buffers:
// shared_memory_collective_backend.cc) and the collectives that move data through it
// (shared_memory_collectives.cc). Every rank maps the same bytes, so this is a wire format: a
// change to it changes kMagic's layout version.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "worker/collectives/shared_memory_collective_backend.h"

namespace dtrain {
namespace shm {

inline constexpr uint64_t kMagic = 0x6474726169E5E305ULL;  // "dtrain" shm, layout version 5
inline constexpr size_t kLine = 64;
inline constexpr size_t kReasonBytes = 512;
// Room for all slots of a world within this much /dev/shm (containers often give 64 MiB).
inline constexpr int64_t kSegmentBudget = int64_t{64} << 20;
inline constexpr int64_t kMaxSlotBytes = int64_t{4} << 20;
inline constexpr int64_t kMinSlotBytes = int64_t{64} << 10;

// The collectives of the segment. Those whose data it cannot carry (a reduction of bools, of 8-
// or 16-bit integers, or by product) only announce themselves there before the inner plane moves
// their data, so that a rank in a different collective is named at once instead of at the inner
// plane's deadline.
enum class CallKind : int32_t {
  kBarrier = 1,
  kAllReduce = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBroadcastBytes = 5,
  kReduce = 6,
  kReduceBooleanDecision = 7,
  kAllocate = 8,             // AllocateForAllReduce: every rank maps every other's new buffer
  kAllReduceThenUpdate = 9,  // AllReduceThenUpdate in a shared buffer
};

// What a rank is doing in its current call; every rank checks every other's after the first
// wait of a call. Two of them per rank, by call parity: a rank cannot start call k + 2 before
// every rank has arrived in call k + 1, i.e. finished reading call k's.
struct Descriptor {
  uint64_t call;
  int64_t numel;
  // An all_reduce in a shared buffer: (buffer index << 40) + element offset; an all_gather: a
  // fingerprint of its rows' shape; else -1.
  int64_t where;
  int32_t kind;
  int32_t dtype;
  int32_t op;
  // Compared: an all_reduce-then-update's 1 when its result lands in each rank's own part only
  // (result_everywhere false), else 0.
  int32_t detail;
  // Not compared: what this rank brings that may differ from the others' (an all_gather's first
  // dimension, a broadcast_bytes' length at its source, a reduce_boolean_decision's vote, an
  // all_reduce-then-update's input when it lies outside its buffer, as `where`, or -1).
  int64_t value;
};

struct alignas(kLine) Arrival {
  std::atomic<uint64_t> count;
  Descriptor descriptors[2];
};
static_assert(sizeof(Arrival) % kLine == 0);  // no two ranks share a cache line
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

inline size_t AlignUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Up to this many ranks, a reduction's pointer lists live on the stack: no allocation per call.
template <typename T>
using PerRank = absl::InlinedVector<T, 8>;

// Writes this rank's descriptor of its next call.
inline void Describe(Arrival& mine, uint64_t call, CallKind kind, int64_t numel, int32_t dtype,
                     int32_t op, int64_t where = -1, int64_t value = 0, int32_t detail = 0) {
  mine.descriptors[call % 2] = {call,  numel, where,  static_cast<int32_t>(kind),
                                dtype, op,    detail, value};
}

}  // namespace shm

// The header at offset 0; then one Arrival line per rank; then, page-aligned, the data:
// buffer set b (0, 1) x slot s (0..world-1: ranks' inputs, world: the result), slot_bytes each.
struct SharedMemoryCollectiveBackend::Segment {
  uint64_t magic;
  uint32_t world;
  uint32_t reserved;
  int64_t slot_bytes;
  std::atomic<uint32_t> poisoned;  // 0 fine, 2 being written, 1 reason readable
  // A futex word bumped at every arrival (and poisoning), and how many ranks sleep on it, so
  // that an arrival makes a wake-up system call only when someone sleeps.
  std::atomic<uint32_t> wakeups;
  std::atomic<uint32_t> sleepers;
  char reason[shm::kReasonBytes];

  static size_t ArrivalsOffset() { return shm::AlignUp(sizeof(Segment), shm::kLine); }
  static size_t DataOffset(int world) {
    return shm::AlignUp(ArrivalsOffset() + world * sizeof(shm::Arrival), 4096);
  }
  static size_t Bytes(int world, int64_t slot) {
    return DataOffset(world) + 2 * static_cast<size_t>(world + 1) * slot;
  }
  shm::Arrival& arrival(int r) {
    return reinterpret_cast<shm::Arrival*>(reinterpret_cast<char*>(this) + ArrivalsOffset())[r];
  }
  char* slot(int buffer, int s) {
    return reinterpret_cast<char*>(this) + DataOffset(world) +
           (static_cast<size_t>(buffer) * (world + 1) + s) * slot_bytes;
  }
};

// One AllocateForAllReduce: every rank's mapping of it, by rank. Tensors over it hold it, so it
// outlives the backend while a gradient still lives there.
struct SharedMemoryCollectiveBackend::SharedBuffer {
  int64_t index = 0;
  size_t bytes = 0;
  // What it was allocated for: a view of it as another type reduces through the slots.
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<char*> bases;
  ~SharedBuffer() {
    for (char* base : bases) {
      if (base != nullptr) munmap(base, bytes);
    }
  }
};

}  // namespace dtrain

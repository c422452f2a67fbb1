#include "worker/collectives/shared_memory_collective_backend.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <vector>

#include <torch/types.h>
#include <torch/utils.h>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

constexpr uint64_t kMagic = 0x6474726169E5E303ULL;  // "dtrain" shm, layout version 3
constexpr size_t kLine = 64;
constexpr size_t kReasonBytes = 512;
// Room for all slots of a world within this much /dev/shm (containers often give 64 MiB).
constexpr int64_t kSegmentBudget = int64_t{64} << 20;
constexpr int64_t kMaxSlotBytes = int64_t{4} << 20;
constexpr int64_t kMinSlotBytes = int64_t{64} << 10;
// broadcast_bytes carries messages (a checkpoint's name, an error, a pickled object), not tensors.
constexpr int64_t kMostBroadcastBytes = int64_t{1} << 30;

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
  kAllocate = 8,  // AllocateForAllReduce: every rank maps every other's new buffer
};

// What a rank is doing in its current call; every rank checks every other's after the first
// wait of a call. Two of them per rank, by call parity: a rank cannot start call k + 2 before
// every rank has arrived in call k + 1, i.e. finished reading call k's.
struct Descriptor {
  uint64_t call;
  int64_t numel;
  // An all_reduce in a shared buffer: (buffer index << 40) + element offset; else -1.
  int64_t where;
  int32_t kind;
  int32_t dtype;
  int32_t op;
  int32_t reserved;
  // Not compared: what this rank brings that may differ from the others' (an all_gather's first
  // dimension, a broadcast_bytes' length at its source, a reduce_boolean_decision's vote).
  int64_t value;
};

struct alignas(kLine) Arrival {
  std::atomic<uint64_t> count;
  Descriptor descriptors[2];
};
static_assert(sizeof(Arrival) % kLine == 0);  // no two ranks share a cache line
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

size_t AlignUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `host` (the worker's --host), else the host name, and the boot.
std::string HostIdentity(const std::string& host) {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  if (!host.empty()) return absl::StrCat(host, "/", boot_id);
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return absl::StrCat(name, "/", boot_id);
}

std::string DescribeCall(const Descriptor& d) {
  const std::string dtype = c10::toString(static_cast<c10::ScalarType>(d.dtype));
  switch (static_cast<CallKind>(d.kind)) {
    case CallKind::kBarrier:
      return "barrier";
    case CallKind::kAllReduce:
      return absl::StrCat("all_reduce of ", d.numel, " ", dtype, " ",
                          v1::ReduceOp_Name(static_cast<v1::ReduceOp>(d.op)),
                          d.where < 0
                              ? ""
                              : absl::StrCat(" in shared buffer #", d.where >> 40, " at element ",
                                             d.where & ((int64_t{1} << 40) - 1)));
    case CallKind::kAllGather:
      return absl::StrCat("all_gather of ", dtype, " rows of ", d.numel, " elements in ", d.op,
                          " dimensions");
    case CallKind::kBroadcast:
      return absl::StrCat("broadcast of ", d.numel, " ", dtype, " from rank ", d.op);
    case CallKind::kBroadcastBytes:
      return absl::StrCat("broadcast of bytes from rank ", d.op);
    case CallKind::kReduce:
      return absl::StrCat("reduce of ", d.numel, " ", dtype, " to rank ", d.op >> 8, " ",
                          v1::ReduceOp_Name(static_cast<v1::ReduceOp>(d.op & 0xff)));
    case CallKind::kReduceBooleanDecision:
      return absl::StrCat("reduce_boolean_decision(all=", d.op ? "true" : "false", ")");
    case CallKind::kAllocate:
      return absl::StrCat("allocation of shared memory for ", d.numel, " ", dtype);
  }
  return absl::StrCat("unknown collective ", d.kind);
}

// "a barrier", "an all_reduce ...".
std::string WithArticle(const std::string& call) {
  return absl::StrCat(call[0] == 'a' || call[0] == 'u' ? "an " : "a ", call);
}

}  // namespace

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
  char reason[kReasonBytes];

  static size_t ArrivalsOffset() { return AlignUp(sizeof(Segment), kLine); }
  static size_t DataOffset(int world) {
    return AlignUp(ArrivalsOffset() + world * sizeof(Arrival), 4096);
  }
  static size_t Bytes(int world, int64_t slot) {
    return DataOffset(world) + 2 * static_cast<size_t>(world + 1) * slot;
  }
  Arrival& arrival(int r) {
    return reinterpret_cast<Arrival*>(reinterpret_cast<char*>(this) + ArrivalsOffset())[r];
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
  std::vector<char*> bases;
  ~SharedBuffer() {
    for (char* base : bases) {
      if (base != nullptr) munmap(base, bytes);
    }
  }
};

SharedMemoryCollectiveBackend::SharedMemoryCollectiveBackend(
    std::unique_ptr<CollectiveBackend> inner, absl::Duration timeout)
    : inner_(std::move(inner)), timeout_(timeout), world_(inner_->world_size()) {
  // The process's cores (its main thread's mask), not this thread's: the thread that forms the
  // plane may be a step thread pinned to one core.
  cpu_set_t cores;
  CPU_ZERO(&cores);
  if (sched_getaffinity(getpid(), sizeof(cores), &cores) == 0) {
    ranks_fit_cores_ = world_ <= CPU_COUNT(&cores);
  }
}

absl::StatusOr<std::unique_ptr<SharedMemoryCollectiveBackend>> SharedMemoryCollectiveBackend::Make(
    std::unique_ptr<CollectiveBackend> inner, absl::Duration timeout, std::string host) {
  std::unique_ptr<SharedMemoryCollectiveBackend> backend(
      new SharedMemoryCollectiveBackend(std::move(inner), timeout));
  DTRAIN_RETURN_IF_ERROR(backend->Attach(host));
  return backend;
}

absl::Status SharedMemoryCollectiveBackend::Attach(const std::string& host) {
  const int world = world_size(), me = rank();
  // 1. Are all ranks on this machine (same host and boot)?
  const std::string identity = HostIdentity(host);
  torch::Tensor mine = torch::from_blob(const_cast<char*>(identity.data()),
                                        {static_cast<int64_t>(identity.size())}, torch::kUInt8)
                           .clone();
  DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> identities, inner_->AllGather(mine));
  for (int r = 0; r < world; ++r) {
    const torch::Tensor& t = identities[r];
    const std::string other(reinterpret_cast<const char*>(t.data_ptr()), t.numel());
    if (other != identity) {
      fallback_reason_ =
          absl::StrCat("rank ", r, " runs on another host (", other, ", not ", identity, ")");
      return absl::OkStatus();
    }
  }
  // 2. Rank 0 makes the segment and reserves its memory (so that a full /dev/shm is an error
  // here, not a SIGBUS later); the others map it by name.
  slot_bytes_ = std::clamp<int64_t>(kSegmentBudget / (2 * (world + 1)) / 4096 * 4096, kMinSlotBytes,
                                    kMaxSlotBytes);
  const size_t bytes = Segment::Bytes(world, slot_bytes_);
  std::string name, error;
  int fd = -1;
  if (me == 0) {
    std::random_device random;
    name = absl::StrCat("/dtrain-", getpid(), "-", absl::Hex(random(), absl::kZeroPad8),
                        absl::Hex(random(), absl::kZeroPad8));
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = absl::StrCat("shm_open ", name, ": ", std::strerror(errno));
    } else if (int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
      error = absl::StrCat("reserving ", bytes, " bytes of /dev/shm: ", std::strerror(e));
    }
  }
  DTRAIN_ASSIGN_OR_RETURN(std::string shared,
                          inner_->BroadcastBytes(error.empty() ? name : "!" + error, 0));
  if (!shared.empty() && shared[0] == '!') {
    fallback_reason_ = shared.substr(1);
  } else {
    if (me != 0) {
      name = shared;
      fd = shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0) error = absl::StrCat("shm_open ", name, ": ", std::strerror(errno));
    }
    if (fd >= 0) {
      struct stat st {};
      if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
        error = absl::StrCat("segment ", name, " is smaller than ", bytes, " bytes");
      } else {
        void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (at == MAP_FAILED) {
          error = absl::StrCat("mmap ", name, ": ", std::strerror(errno));
        } else {
          segment_ = static_cast<Segment*>(at);
          mapped_bytes_ = bytes;
        }
      }
    }
  }
  if (fd >= 0) close(fd);
  if (me == 0 && segment_ != nullptr) {
    segment_->magic = kMagic;
    segment_->world = static_cast<uint32_t>(world);
    segment_->slot_bytes = slot_bytes_;
    new (&segment_->poisoned) std::atomic<uint32_t>(0);
    new (&segment_->wakeups) std::atomic<uint32_t>(0);
    new (&segment_->sleepers) std::atomic<uint32_t>(0);
    for (int r = 0; r < world; ++r) new (&segment_->arrival(r).count) std::atomic<uint64_t>(0);
  }
  // 3. Everyone mapped it, or nobody uses it. After this, the name can go: the mappings keep
  // the memory, and a crash cannot leak it.
  torch::Tensor ok = torch::tensor({segment_ != nullptr && error.empty() ? 1 : 0}, torch::kInt32);
  DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> oks, inner_->AllGather(ok));
  if (me == 0 && !name.empty()) shm_unlink(name.c_str());
  std::vector<int> failed;
  for (int r = 0; r < world; ++r) {
    if (oks[r].item<int>() == 0) failed.push_back(r);
  }
  if (!failed.empty() && fallback_reason_.empty()) {
    fallback_reason_ = absl::StrCat("rank(s) ", absl::StrJoin(failed, ", "),
                                    " could not map the shared-memory segment",
                                    error.empty() ? "" : absl::StrCat(" (here: ", error, ")"));
  }
  if (!failed.empty() && segment_ != nullptr) {
    munmap(segment_, mapped_bytes_);
    segment_ = nullptr;
  }
  if (segment_ != nullptr &&
      (segment_->magic != kMagic || segment_->world != static_cast<uint32_t>(world) ||
       segment_->slot_bytes != slot_bytes_)) {
    return absl::InternalError("shared-memory segment layout differs between ranks");
  }
  return absl::OkStatus();
}

SharedMemoryCollectiveBackend::~SharedMemoryCollectiveBackend() {
  if (segment_ != nullptr) munmap(segment_, mapped_bytes_);
}

absl::Status SharedMemoryCollectiveBackend::Poison(absl::Status status) {
  uint32_t expected = 0;
  if (segment_->poisoned.compare_exchange_strong(expected, 2)) {
    const std::string reason = absl::StrCat("rank ", rank(), ": ", status.message());
    std::strncpy(segment_->reason, reason.c_str(), kReasonBytes - 1);
    segment_->poisoned.store(1, std::memory_order_release);
    segment_->wakeups.fetch_add(1);
    WakeSleepers();
  }
  broken_ = status;
  return status;
}

void SharedMemoryCollectiveBackend::WakeSleepers() {
  if (segment_->sleepers.load() > 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&segment_->wakeups), FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
  }
}

absl::Status SharedMemoryCollectiveBackend::ArriveAndWait(const char* what) {
  if (!broken_.ok()) return broken_;
  ++arrivals_;
  segment_->arrival(rank()).count.store(arrivals_, std::memory_order_release);
  segment_->wakeups.fetch_add(1);
  WakeSleepers();
  auto all_arrived = [&] {
    for (int r = 0; r < world_size(); ++r) {
      if (segment_->arrival(r).count.load(std::memory_order_acquire) < arrivals_) return false;
    }
    return true;
  };
  // Poll before sleeping on the futex in the segment: a peer on another core arrives within
  // microseconds, and a rank woken from a sleep pays a wake-up (a halted vCPU's, on a VM) at
  // every step: 1 ms of polling instead of 20 us bought +8.7% of the MLP's samples/s
  // (docs/BENCHMARKS.md). Only briefly on a thread that overlaps compute on its own core (ddp's
  // communication thread during backward), or when ranks outnumber the cores, where polling
  // would take the core the awaited rank needs.
  const absl::Time start = absl::Now();
  const absl::Duration poll = ScopedOverlappedWaits::active() || !ranks_fit_cores_
                                  ? absl::Microseconds(20)
                                  : absl::Milliseconds(1);
  for (int spins = 0;; ++spins) {
    if (all_arrived()) return absl::OkStatus();
    if (spins % 64 == 63) {
      if (absl::Now() - start > poll || segment_->poisoned.load() != 0) break;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  const absl::Time deadline = start + timeout_;
  absl::Time next_health = start;
  while (true) {
    segment_->sleepers.fetch_add(1);
    const uint32_t seen = segment_->wakeups.load();
    if (!all_arrived() && segment_->poisoned.load() == 0) {
      const timespec nap{0, 20'000'000};  // 20 ms: then check the group's health and the deadline
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&segment_->wakeups), FUTEX_WAIT, seen, &nap,
              nullptr, 0);
    }
    segment_->sleepers.fetch_sub(1);
    if (all_arrived()) return absl::OkStatus();
    if (uint32_t p = segment_->poisoned.load(std::memory_order_acquire); p != 0) {
      if (p == 2) absl::SleepFor(absl::Milliseconds(1));
      broken_ = absl::AbortedError(absl::StrCat("shm ", what, " on rank ", rank(),
                                                ": another rank failed: ", segment_->reason));
      return broken_;
    }
    if (absl::Status i = interruption(); !i.ok()) {
      return Poison(absl::Status(
          i.code(), absl::StrCat("shm ", what, " on rank ", rank(), ": ", i.message())));
    }
    const absl::Time now = absl::Now();
    if (now >= next_health) {
      next_health = now + absl::Milliseconds(50);
      if (absl::Status h = inner_->health(); !h.ok()) {
        return Poison(absl::Status(h.code(), absl::StrCat("shm ", what, ": ", h.message())));
      }
    }
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < world_size(); ++r) {
        if (segment_->arrival(r).count.load(std::memory_order_acquire) < arrivals_) {
          missing.push_back(r);
        }
      }
      return Poison(absl::DeadlineExceededError(absl::StrCat(
          "shm ", what, " on rank ", rank(), ": rank(s) ", absl::StrJoin(missing, ", "),
          " did not arrive within ", absl::FormatDuration(timeout_),
          " (stuck, or running a different collective)")));
    }
  }
}

namespace {

// Up to this many ranks, a reduction's pointer lists live on the stack: no allocation per call.
template <typename T>
using PerRank = absl::InlinedVector<T, 8>;

// out[k] = in[0] op in[1] op ... for `count` elements of `dtype` (float, double, int32 or int64:
// the kinds the segment reduces) at `offset` elements into each of `in` and `out`, in rank
// order: both all_reduce paths reduce through here, so their results are bitwise the same.
template <typename T>
void ReduceTyped(const PerRank<char*>& in, const PerRank<char*>& out, int64_t offset, int64_t count,
                 ReductionKind kind) {
  PerRank<const T*> ins;
  PerRank<T*> outs;
  for (char* p : in) ins.push_back(reinterpret_cast<const T*>(p) + offset);
  for (char* p : out) outs.push_back(reinterpret_cast<T*>(p) + offset);
  ReduceInRankOrder<T>(ins.data(), static_cast<int>(ins.size()), outs.data(),
                       static_cast<int>(outs.size()), count, kind);
}

void ReduceRaw(torch::ScalarType dtype, const PerRank<char*>& in, const PerRank<char*>& out,
               int64_t offset, int64_t count, v1::ReduceOp op) {
  const ReductionKind kind = op == v1::REDUCE_OP_MAX    ? ReductionKind::kMax
                             : op == v1::REDUCE_OP_MIN  ? ReductionKind::kMin
                             : op == v1::REDUCE_OP_MEAN ? ReductionKind::kMean
                                                        : ReductionKind::kSum;
  switch (dtype) {
    case torch::kFloat64:
      ReduceTyped<double>(in, out, offset, count, kind);
      break;
    case torch::kInt64:
      ReduceTyped<int64_t>(in, out, offset, count, kind);
      break;
    case torch::kInt32:
      ReduceTyped<int32_t>(in, out, offset, count, kind);
      break;
    default:
      ReduceTyped<float>(in, out, offset, count, kind);
  }
}

// Writes this rank's descriptor of its next call.
void Describe(Arrival& mine, uint64_t call, CallKind kind, int64_t numel, int32_t dtype, int32_t op,
              int64_t where = -1, int64_t value = 0) {
  mine.descriptors[call % 2] = {call,  numel, where, static_cast<int32_t>(kind),
                                dtype, op,    0,     value};
}

}  // namespace

absl::Status SharedMemoryCollectiveBackend::Barrier(const std::string& name) {
  if (segment_ == nullptr) return inner_->Barrier(name);
  return Announce(static_cast<int32_t>(CallKind::kBarrier), 0, 0, 0, "barrier");
}

absl::Status SharedMemoryCollectiveBackend::Announce(int32_t kind, int64_t numel, int32_t dtype,
                                                     int32_t op, const char* what) {
  if (!broken_.ok()) return broken_;
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(rank()), call, static_cast<CallKind>(kind), numel, dtype, op);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait(what));
  return MatchCalls(call);
}

absl::Status SharedMemoryCollectiveBackend::MatchCalls(uint64_t call) {
  const Descriptor& mine = segment_->arrival(rank()).descriptors[call % 2];
  for (int r = 0; r < world_size(); ++r) {
    const Descriptor& d = segment_->arrival(r).descriptors[call % 2];
    if (d.kind != mine.kind || d.call != call || d.numel != mine.numel || d.dtype != mine.dtype ||
        d.op != mine.op || d.where != mine.where) {
      return Poison(absl::FailedPreconditionError(absl::StrCat(
          "mismatched collective #", call, ": rank ", rank(), " is in ",
          WithArticle(DescribeCall(mine)), ", rank ", r, " in ", WithArticle(DescribeCall(d)))));
    }
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryCollectiveBackend::Broadcast(torch::Tensor& tensor, int src) {
  if (segment_ == nullptr) return inner_->Broadcast(tensor, src);
  if (src < 0 || src >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast src ", src, " outside world of ", world_));
  }
  if (!tensor.device().is_cpu()) {
    return RunOnHost(
        tensor, [&](torch::Tensor& host) { return Broadcast(host, src); }, rank() != src);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(rank()), call, CallKind::kBroadcast, tensor.numel(),
           static_cast<int32_t>(tensor.scalar_type()), src);
  DTRAIN_RETURN_IF_ERROR(MoveBytes(call, "broadcast", src, static_cast<char*>(flat.data_ptr()),
                                   flat.numel() * static_cast<int64_t>(flat.element_size())));
  if (rank() != src && !flat.is_same(tensor)) tensor.copy_(flat);
  return absl::OkStatus();
}

absl::Status SharedMemoryCollectiveBackend::MoveBytes(uint64_t call, const char* what, int src,
                                                      char* data, int64_t bytes) {
  const int me = rank();
  // At least one round, so that the descriptors are compared even for nothing to move.
  for (int64_t offset = 0, round = 0; round == 0 || offset < bytes;
       offset += slot_bytes_, ++round) {
    const int b = static_cast<int>(round % 2);
    const int64_t count = std::min(slot_bytes_, bytes - offset);
    if (me == src && count > 0) std::memcpy(segment_->slot(b, src), data + offset, count);
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait(what));
    if (round == 0) DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
    if (count <= 0) break;
    if (me != src) std::memcpy(data + offset, segment_->slot(b, src), count);
    // The source may not refill this buffer set before every rank has read it.
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait(what));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SharedMemoryCollectiveBackend::BroadcastBytes(const std::string& bytes,
                                                                          int src) {
  if (segment_ == nullptr) return inner_->BroadcastBytes(bytes, src);
  if (src < 0 || src >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast src ", src, " outside world of ", world_));
  }
  if (!broken_.ok()) return broken_;
  const int me = rank();
  const uint64_t call = ++calls_;
  // The length travels in the source's descriptor; the bytes through the slots.
  Describe(segment_->arrival(me), call, CallKind::kBroadcastBytes, 0, 0, src, -1,
           me == src ? static_cast<int64_t>(bytes.size()) : 0);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("broadcast"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  const int64_t size = segment_->arrival(src).descriptors[call % 2].value;
  if (size < 0) {
    return Poison(absl::InternalError(
        absl::StrCat("shm broadcast: rank ", src, " announced ", size, " bytes")));
  }
  // Every rank read the same length, so every rank refuses alike and the plane stays whole.
  if (size > kMostBroadcastBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm broadcast: rank ", src, " broadcasts ",
                                                   size, " bytes, over the ", kMostBroadcastBytes,
                                                   " a broadcast of bytes may carry"));
  }
  std::string out;
  try {
    out = me == src ? bytes : std::string(static_cast<size_t>(size), '\0');
  } catch (const std::bad_alloc&) {
    // The others would wait for this rank's arrival until the deadline: stop them now.
    return Poison(absl::ResourceExhaustedError(
        absl::StrCat("shm broadcast: cannot hold the ", size, " bytes rank ", src, " sends")));
  }
  const uint64_t data_call = ++calls_;
  Describe(segment_->arrival(me), data_call, CallKind::kBroadcastBytes, size, 0, src);
  DTRAIN_RETURN_IF_ERROR(MoveBytes(data_call, "broadcast", src, out.data(), size));
  return out;
}

absl::StatusOr<std::vector<torch::Tensor>> SharedMemoryCollectiveBackend::AllGather(
    const torch::Tensor& tensor) {
  if (segment_ == nullptr) return inner_->AllGather(tensor);
  if (!tensor.device().is_cpu()) {
    DTRAIN_ASSIGN_OR_RETURN(
        torch::Tensor host,
        GuardTorch("cannot copy all_gather's tensor to the host",
                   [&]() -> absl::StatusOr<torch::Tensor> { return tensor.to(torch::kCPU); }));
    DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> parts, AllGather(host));
    return OnDeviceOf(std::move(parts), tensor);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  // Dimension 0 may differ between ranks; the dtype, the number of dimensions and a row's
  // elements may not (the descriptor compares them), and each row is whole in the slots.
  const torch::Tensor input = tensor.dim() == 0 ? tensor.reshape({1}) : tensor.contiguous();
  const int world = world_, me = rank();
  const int64_t rows = input.size(0);
  const int64_t row_elements = rows > 0 ? input.numel() / rows : [&] {
    int64_t n = 1;
    for (int64_t d = 1; d < input.dim(); ++d) n *= input.size(d);
    return n;
  }();
  const int64_t row_bytes = row_elements * static_cast<int64_t>(input.element_size());
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(me), call, CallKind::kAllGather, row_elements,
           static_cast<int32_t>(input.scalar_type()), static_cast<int32_t>(input.dim()), -1, rows);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_gather"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  std::vector<int64_t> bytes(world);
  std::vector<torch::Tensor> parts(world);
  int64_t largest = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t r_rows = segment_->arrival(r).descriptors[call % 2].value;
    if (r_rows < 0 || (row_bytes > 0 && r_rows > (int64_t{1} << 40) / row_bytes)) {
      return Poison(absl::InternalError(
          absl::StrCat("shm all_gather: rank ", r, " announced ", r_rows, " rows")));
    }
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = r_rows;
    // A rank that cannot hold the parts stops every rank at once, not at the deadline.
    absl::StatusOr<torch::Tensor> part =
        GuardTorch("shm all_gather: cannot allocate the gathered parts",
                   [&]() -> absl::StatusOr<torch::Tensor> {
                     return r == me ? input.clone() : torch::empty(shape, input.options());
                   });
    if (!part.ok()) return Poison(part.status());
    parts[r] = *std::move(part);
    bytes[r] = r_rows * row_bytes;
    largest = std::max(largest, bytes[r]);
  }
  const char* mine = static_cast<const char*>(input.data_ptr());
  for (int64_t offset = 0, round = 0; offset < largest; offset += slot_bytes_, ++round) {
    // After the descriptors' barrier: two barriers a round, each round a buffer set of its own.
    const int b = static_cast<int>(round % 2);
    const int64_t count = std::clamp<int64_t>(bytes[me] - offset, 0, slot_bytes_);
    if (count > 0) std::memcpy(segment_->slot(b, me), mine + offset, count);
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_gather"));
    for (int r = 0; r < world; ++r) {
      const int64_t theirs = std::clamp<int64_t>(bytes[r] - offset, 0, slot_bytes_);
      if (r != me && theirs > 0) {
        std::memcpy(static_cast<char*>(parts[r].data_ptr()) + offset, segment_->slot(b, r), theirs);
      }
    }
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_gather"));
  }
  if (tensor.dim() == 0) {
    for (torch::Tensor& p : parts) p = p.reshape({});
  }
  return parts;
}

absl::Status SharedMemoryCollectiveBackend::Reduce(torch::Tensor& tensor, int dst,
                                                   v1::ReduceOp op) {
  if (segment_ == nullptr) return inner_->Reduce(tensor, dst, op);
  if (dst < 0 || dst >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce dst ", dst, " outside world of ", world_));
  }
  if (!tensor.device().is_cpu()) {
    return RunOnHost(
        tensor, [&](torch::Tensor& host) { return Reduce(host, dst, op); }, rank() == dst);
  }
  const int32_t described = (dst << 8) | static_cast<int32_t>(op);
  if (!ReducedHere(tensor, op)) {
    DTRAIN_RETURN_IF_ERROR(Announce(static_cast<int32_t>(CallKind::kReduce), tensor.numel(),
                                    static_cast<int32_t>(tensor.scalar_type()), described,
                                    "reduce"));
    return inner_->Reduce(tensor, dst, op);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
  DTRAIN_RETURN_IF_ERROR(
      ReduceChunks(flat, op, static_cast<int32_t>(CallKind::kReduce), described, rank() == dst));
  if (rank() == dst && flat.data_ptr() != tensor.data_ptr()) {
    tensor.copy_(flat.view(tensor.sizes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SharedMemoryCollectiveBackend::ReduceBooleanDecision(bool decision, bool all) {
  if (segment_ == nullptr) return inner_->ReduceBooleanDecision(decision, all);
  if (!broken_.ok()) return broken_;
  // The votes travel in the descriptors, which stay readable until every rank has arrived in
  // the call after this one: one barrier is the whole collective.
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(rank()), call, CallKind::kReduceBooleanDecision, 0, 0, all ? 1 : 0, -1,
           decision ? 1 : 0);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("reduce_boolean_decision"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  bool every = true, some = false;
  for (int r = 0; r < world_; ++r) {
    const bool vote = segment_->arrival(r).descriptors[call % 2].value != 0;
    every = every && vote;
    some = some || vote;
  }
  return all ? every : some;
}

absl::Status SharedMemoryCollectiveBackend::AllReduce(torch::Tensor& tensor, v1::ReduceOp op) {
  // A CUDA tensor is reduced here through a host copy, not handed to the inner plane: this
  // plane is the one a CUDA job's gradients really travel on (and the one reported).
  if (!tensor.device().is_cpu()) {
    return RunOnHost(tensor, [&](torch::Tensor& host) { return AllReduce(host, op); });
  }
  if (segment_ == nullptr) return inner_->AllReduce(tensor, op);
  if (!ReducedHere(tensor, op)) {
    DTRAIN_RETURN_IF_ERROR(Announce(static_cast<int32_t>(CallKind::kAllReduce), tensor.numel(),
                                    static_cast<int32_t>(tensor.scalar_type()), op, "all_reduce"));
    return inner_->AllReduce(tensor, op);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  if (const SharedBuffer* shared = FindSharedBuffer(tensor); shared != nullptr) {
    const int64_t offset =
        (static_cast<char*>(tensor.data_ptr()) - shared->bases[rank()]) / tensor.element_size();
    return ReduceInPlace(*shared, offset, tensor.numel(), tensor.scalar_type(), op);
  }
  torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
  DTRAIN_RETURN_IF_ERROR(
      ReduceChunks(flat, op, static_cast<int32_t>(CallKind::kAllReduce), op, /*lands_here=*/true));
  if (!flat.is_same(tensor) && flat.data_ptr() != tensor.data_ptr()) {
    tensor.copy_(flat.view(tensor.sizes()));
  }
  return absl::OkStatus();
}

bool SharedMemoryCollectiveBackend::ReducedHere(const torch::Tensor& tensor, v1::ReduceOp op) {
  const torch::ScalarType t = tensor.scalar_type();
  return (t == torch::kFloat32 || t == torch::kFloat64 || t == torch::kBFloat16 ||
          t == torch::kHalf || t == torch::kInt32 || t == torch::kInt64) &&
         (op == v1::REDUCE_OP_SUM || op == v1::REDUCE_OP_MEAN || op == v1::REDUCE_OP_MAX ||
          op == v1::REDUCE_OP_MIN);
}

absl::Status SharedMemoryCollectiveBackend::ReduceChunks(torch::Tensor& flat, v1::ReduceOp op,
                                                         int32_t kind, int32_t described,
                                                         bool lands_here) {
  const int world = world_size(), me = rank();
  const uint64_t call = ++calls_;
  const int64_t n = flat.numel();
  Describe(segment_->arrival(me), call, static_cast<CallKind>(kind), n,
           static_cast<int32_t>(flat.scalar_type()), described);
  // 16-bit floats (bf16-true's gradient buckets) are widened into float32 slots on the way in
  // and rounded once on the way out, as the coordinator's plane reduces them.
  const torch::ScalarType slot_type =
      flat.scalar_type() == torch::kBFloat16 || flat.scalar_type() == torch::kHalf
          ? torch::kFloat32
          : flat.scalar_type();
  const int64_t slot_element = static_cast<int64_t>(c10::elementSize(slot_type));
  const int64_t per_chunk = slot_bytes_ / slot_element;
  const auto options = torch::TensorOptions().dtype(slot_type);
  auto view = [&](int buffer, int s, int64_t begin, int64_t count) {
    return torch::from_blob(segment_->slot(buffer, s) + begin * slot_element, {count}, options);
  };
  // A chunk loop of at least one round, so that the descriptors are compared even for an
  // empty tensor.
  int chunk = 0;
  for (int64_t offset = 0; chunk == 0 || offset < n; offset += per_chunk, ++chunk) {
    const int b = chunk % 2;
    const int64_t count = std::min(per_chunk, n - offset);
    if (count > 0) view(b, me, 0, count).copy_(flat.slice(0, offset, offset + count));
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_reduce"));
    if (chunk == 0) DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
    if (count <= 0) break;
    // This rank's partition, reduced over the ranks in rank order.
    const int64_t begin = count * me / world, end = count * (me + 1) / world;
    if (end > begin) {
      PerRank<char*> in;
      for (int r = 0; r < world; ++r) in.push_back(segment_->slot(b, r));
      ReduceRaw(slot_type, in, {segment_->slot(b, world)}, begin, end - begin, op);
    }
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_reduce"));
    if (lands_here) flat.slice(0, offset, offset + count).copy_(view(b, world, 0, count));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryCollectiveBackend::Leave() { return inner_->Leave(); }

absl::StatusOr<torch::Tensor> SharedMemoryCollectiveBackend::AllocateForAllReduce(
    int64_t numel, torch::ScalarType dtype) {
  const bool supported = dtype == torch::kFloat32 || dtype == torch::kFloat64;
  if (segment_ == nullptr || !supported || numel <= 0) {
    return CollectiveBackend::AllocateForAllReduce(numel, dtype);
  }
  DTRAIN_RETURN_IF_ERROR(Announce(static_cast<int32_t>(CallKind::kAllocate), numel,
                                  static_cast<int32_t>(dtype), 0, "allocate"));
  const int world = world_, me = rank();
  auto buffer = std::make_shared<SharedBuffer>();
  buffer->index = static_cast<int64_t>(shared_buffers_.size());
  buffer->bytes = AlignUp(static_cast<size_t>(numel) * c10::elementSize(dtype), 4096);
  buffer->bases.assign(world, nullptr);
  // Each rank makes its own object (reserved, so that a full /dev/shm is an error now, not a
  // SIGBUS in backward), then maps everyone's by name.
  auto map = [&](const std::string& name, int r) -> std::string {
    const bool create = r == me;
    const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0) return absl::StrCat("shm_open ", name, ": ", std::strerror(errno));
    std::string error;
    struct stat st {};
    if (create) {
      if (int e = posix_fallocate(fd, 0, static_cast<off_t>(buffer->bytes)); e != 0) {
        error = absl::StrCat("reserving ", buffer->bytes, " bytes of /dev/shm: ", std::strerror(e));
      }
    } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < buffer->bytes) {
      error = absl::StrCat(name, " is smaller than ", buffer->bytes, " bytes");
    }
    if (error.empty()) {
      void* at = mmap(nullptr, buffer->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (at == MAP_FAILED) {
        error = absl::StrCat("mmap ", name, ": ", std::strerror(errno));
      } else {
        buffer->bases[r] = static_cast<char*>(at);
      }
    }
    close(fd);
    return error;
  };
  std::random_device random;
  const std::string name =
      absl::StrCat("/dtrain-", getpid(), "-", absl::Hex(random(), absl::kZeroPad8),
                   absl::Hex(random(), absl::kZeroPad8));
  std::string error = map(name, me);
  const std::string mine = error.empty() ? name : "!" + error;
  torch::Tensor wire = torch::from_blob(const_cast<char*>(mine.data()),
                                        {static_cast<int64_t>(mine.size())}, torch::kUInt8)
                           .clone();
  absl::StatusOr<std::vector<torch::Tensor>> names = inner_->AllGather(wire);
  if (names.ok()) {
    for (int r = 0; r < world && error.empty(); ++r) {
      if (r == me) continue;
      const std::string other(reinterpret_cast<const char*>((*names)[r].data_ptr()),
                              (*names)[r].numel());
      if (!other.empty() && other[0] == '!') {
        error = absl::StrCat("rank ", r, ": ", other.substr(1));
        break;
      }
      error = map(other, r);
    }
  }
  // Everyone mapped every buffer, or nobody uses them; then the names can go.
  torch::Tensor ok = torch::tensor({names.ok() && error.empty() ? 1 : 0}, torch::kInt32);
  absl::StatusOr<std::vector<torch::Tensor>> oks = inner_->AllGather(ok);
  shm_unlink(name.c_str());
  if (!names.ok()) return names.status();
  if (!oks.ok()) return oks.status();
  for (int r = 0; r < world; ++r) {
    if ((*oks)[r].item<int>() == 0) {
      LogWarning(absl::StrCat("shm: ", numel, " ", c10::toString(dtype),
                              " for all_reduce in ordinary memory (copied in and out): rank ", r,
                              " could not map the shared buffers",
                              error.empty() ? "" : absl::StrCat(" (here: ", error, ")")),
                 {{"rank", static_cast<int64_t>(me)}});
      return CollectiveBackend::AllocateForAllReduce(numel, dtype);
    }
  }
  shared_buffers_.push_back(buffer);
  return torch::from_blob(
      buffer->bases[me], {numel}, [buffer](void*) {}, torch::TensorOptions().dtype(dtype));
}

const SharedMemoryCollectiveBackend::SharedBuffer* SharedMemoryCollectiveBackend::FindSharedBuffer(
    const torch::Tensor& tensor) const {
  if (shared_buffers_.empty() || !tensor.is_contiguous() || !tensor.device().is_cpu()) {
    return nullptr;
  }
  const char* begin = static_cast<const char*>(tensor.data_ptr());
  const size_t bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
  for (const auto& buffer : shared_buffers_) {
    const char* base = buffer->bases[rank()];
    if (begin >= base && begin + bytes <= base + buffer->bytes &&
        (begin - base) % tensor.element_size() == 0) {
      return buffer.get();
    }
  }
  return nullptr;
}

absl::Status SharedMemoryCollectiveBackend::ReduceInPlace(const SharedBuffer& buffer,
                                                          int64_t offset, int64_t numel,
                                                          torch::ScalarType dtype,
                                                          v1::ReduceOp op) {
  const int world = world_, me = rank();
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(me), call, CallKind::kAllReduce, numel, static_cast<int32_t>(dtype),
           op, (buffer.index << 40) + offset);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_reduce"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  // This rank's partition, reduced in one pass from every rank's memory into every rank's.
  const int64_t begin = numel * me / world, end = numel * (me + 1) / world;
  if (end > begin) {
    const PerRank<char*> every(buffer.bases.begin(), buffer.bases.end());
    ReduceRaw(dtype, every, every, offset + begin, end - begin, op);
  }
  // Nobody reads the result before every rank has written its partition everywhere.
  return ArriveAndWait("all_reduce");
}

}  // namespace dtrain

// The shm plane's segment: making and mapping it (Attach), arrivals and waits with their
// deadline, matching every rank's call, poisoning, and the shared buffers of
// AllocateForAllReduce. The collectives that move data through it are in
// shared_memory_collectives.cc.
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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/collectives/shared_memory_segment.h"
#include "worker/model/torch_status.h"

namespace dtrain {

using shm::AlignUp;
using shm::CallKind;
using shm::Describe;
using shm::Descriptor;
using shm::kMagic;
using shm::kMaxSlotBytes;
using shm::kMinSlotBytes;
using shm::kReasonBytes;
using shm::kSegmentBudget;

namespace {

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
      if (d.op == 0) return absl::StrCat("all_gather of ", dtype, " scalars");
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
    case CallKind::kAllReduceThenUpdate:
      return absl::StrCat("all_reduce of ", d.numel, " ", dtype, " ",
                          v1::ReduceOp_Name(static_cast<v1::ReduceOp>(d.op)),
                          " then a split update, in shared buffer #", d.where >> 40, " at element ",
                          d.where & ((int64_t{1} << 40) - 1),
                          d.detail != 0 ? ", its result in each rank's own part only" : "");
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

absl::Status SharedMemoryCollectiveBackend::MatchCalls(uint64_t call,
                                                       absl::Span<const int64_t> row_shape) {
  const Descriptor& mine = segment_->arrival(rank()).descriptors[call % 2];
  for (int r = 0; r < world_size(); ++r) {
    const Descriptor& d = segment_->arrival(r).descriptors[call % 2];
    const bool same_but_where = d.kind == mine.kind && d.call == call && d.numel == mine.numel &&
                                d.dtype == mine.dtype && d.op == mine.op && d.detail == mine.detail;
    if (same_but_where && d.where == mine.where) continue;
    // All_gathers whose rows hold as many elements in as many dimensions and differ in shape
    // ([2, 3] against [3, 2]): each rank knows its own shape only, and says it.
    if (same_but_where && static_cast<CallKind>(d.kind) == CallKind::kAllGather) {
      return Poison(absl::FailedPreconditionError(
          absl::StrCat("mismatched collective #", call, ": rank ", rank(), " is in ",
                       WithArticle(DescribeCall(mine)), " shaped [", absl::StrJoin(row_shape, ", "),
                       "], rank ", r, " in one whose rows have another shape")));
    }
    return Poison(absl::FailedPreconditionError(absl::StrCat(
        "mismatched collective #", call, ": rank ", rank(), " is in ",
        WithArticle(DescribeCall(mine)), ", rank ", r, " in ", WithArticle(DescribeCall(d)))));
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
  buffer->dtype = dtype;
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
    if (buffer->dtype != tensor.scalar_type()) continue;
    const char* base = buffer->bases[rank()];
    if (begin >= base && begin + bytes <= base + buffer->bytes &&
        (begin - base) % tensor.element_size() == 0) {
      return buffer.get();
    }
  }
  return nullptr;
}

}  // namespace dtrain

// The same-host fast path of the peer-to-peer data plane (collective_backend: shm): when every
// rank of a group runs on this machine, barriers and all_reduce of floating-point (16-bit ones
// reduced in float32 and rounded once), int32 and int64 tensors go through one POSIX
// shared-memory segment instead of sockets, so a 16 MiB gradient bucket costs memory copies, not
// loopback TCP round trips (as NCCL's and MPI's intra-node transports do). So do broadcast,
// all_gather, reduce and reduce_boolean_decision: a same-host job never needs another plane for
// its data. What it cannot carry (a reduction of bools, of 8- or 16-bit integers or by product,
// and every collective when the ranks are on different hosts) goes to the plane it wraps: the
// coordinator's (collective_plane.cc), so that a same-host job keeps no Gloo context and its
// transport thread.
//
// The algorithm, per chunk of at most the slot size: each rank copies its chunk into its slot;
// after a barrier each rank reduces its partition (about 1/world, its boundaries on cache lines:
// reduction_partition.h) over all slots into the shared result; after a second barrier every rank
// copies the result out. Partitions are reduced in rank order by one rank each, so every rank gets
// bitwise the same result. Two alternating buffer sets make two barriers per chunk enough.
//
// Memory handed out by AllocateForAllReduce (ddp's gradient buckets, which the gradients
// themselves live in) is one shared-memory object per rank that every rank maps: an all_reduce
// of a tensor lying there copies nothing in or out. After one barrier each rank reduces its
// partition straight from every rank's memory, in rank order, and writes the result into every
// rank's memory; a second barrier ends it. Bitwise the same result as the slot path.
//
// Nothing waits forever: a wait polls the coordinator's verdict on the group (a dead or departed
// member, by name) and this rank's interruption (a cancelled step), and gives up at the collective
// timeout naming the ranks that did not arrive. Ranks whose calls disagree (shape, dtype, op) all
// fail with FAILED_PRECONDITION naming them. After any failure the segment is poisoned and every
// later call fails at once.
//
// Thread-safety: as CollectiveBackend (one collective at a time per rank).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/collectives/collective_backend.h"

namespace dtrain {

class SharedMemoryCollectiveBackend : public CollectiveBackend {
 public:
  // Wraps `inner` (every rank passes its own). If the ranks are not all on this host (the same
  // `host`, by default the host name, and the same boot), or the segment cannot be made (no
  // /dev/shm, no space), every call goes to `inner` and `fallback_reason()` says why. `timeout`
  // bounds each wait.
  static absl::StatusOr<std::unique_ptr<SharedMemoryCollectiveBackend>> Make(
      std::unique_ptr<CollectiveBackend> inner, absl::Duration timeout, std::string host = "");
  ~SharedMemoryCollectiveBackend() override;

  std::string name() const override { return "shm"; }
  bool AllReduceComputesOnCaller() const override { return active(); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return world_; }
  int local_rank() const override { return inner_->local_rank(); }
  int node_rank() const override { return inner_->node_rank(); }
  absl::Status health() const override { return inner_->health(); }

  absl::Status Barrier(const std::string& name) override;
  // A collective whose data goes through the inner plane announces itself in the segment
  // first: a rank in another collective is named at once (FAILED_PRECONDITION).
  absl::Status Broadcast(torch::Tensor& tensor, int src) override;
  absl::StatusOr<std::string> BroadcastBytes(const std::string& bytes, int src) override;
  absl::Status AllReduce(torch::Tensor& tensor, v1::ReduceOp op) override;
  // With `tensor` and `mirror` both in memory from AllocateForAllReduce: after the first
  // barrier each rank reduces its partition into every rank's `tensor` (its own only, without
  // `result_everywhere`: writing the peers' lines costs the MLP's step ~1%), updates that
  // partition and copies it into every rank's `mirror`; a second barrier ends it (the same two
  // barriers as AllReduce). A `source` in such memory too is read in place on every rank (each
  // rank says where its own is). Otherwise as the default.
  absl::Status AllReduceThenUpdate(torch::Tensor& tensor, v1::ReduceOp op, torch::Tensor& mirror,
                                   const SplitUpdate& update, const torch::Tensor& source = {},
                                   bool result_everywhere = true) override;
  bool SharedWithPeers(const torch::Tensor& tensor) const override {
    return FindSharedBuffer(tensor) != nullptr;
  }
  absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& tensor) override;
  absl::Status Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) override;
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all) override;
  absl::Status Leave() override;
  // Shared memory for float32/float64 on an active segment; ordinary memory otherwise (and,
  // with a warning, when /dev/shm cannot hold it).
  absl::StatusOr<torch::Tensor> AllocateForAllReduce(int64_t numel,
                                                     torch::ScalarType dtype) override;
  void Interrupt(absl::Status why) override {
    inner_->Interrupt(why);
    CollectiveBackend::Interrupt(std::move(why));
  }
  void ClearInterrupt() override {
    inner_->ClearInterrupt();
    CollectiveBackend::ClearInterrupt();
  }

  // Whether the shared-memory path is in use, and if not, why.
  bool active() const { return segment_ != nullptr; }
  const std::string& fallback_reason() const { return fallback_reason_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  // Ranks' inputs an AllReduceThenUpdate read from their `source` in place, over this rank's
  // calls (for tests).
  int64_t inputs_read_in_place() const { return inputs_read_in_place_; }

 private:
  // A call every rank must make alike: arrives, then compares every rank's descriptor with its
  // own (kind, call number, numel, dtype, op).
  absl::Status Announce(int32_t kind, int64_t numel, int32_t dtype, int32_t op, const char* what);
  // After every rank arrived in `call`: FAILED_PRECONDITION (and the segment poisoned) naming
  // both calls when a rank's descriptor differs from this one's. An all_gather passes its rows'
  // shape, which its descriptor holds only as a fingerprint, to be named.
  absl::Status MatchCalls(uint64_t call, absl::Span<const int64_t> row_shape = {});
  struct Segment;
  struct SharedBuffer;
  // The buffer of AllocateForAllReduce that holds all of `tensor` (contiguous, of the type the
  // buffer was allocated for), if any.
  const SharedBuffer* FindSharedBuffer(const torch::Tensor& tensor) const;
  // All-reduces `numel` elements at element `offset` of `buffer`, in every rank's memory.
  // With `mirror` (a buffer and element offset), the call is AllReduceThenUpdate's; with
  // `source` too, this rank's input is there (each rank's may lie elsewhere: it is described).
  absl::Status ReduceInPlace(const SharedBuffer& buffer, int64_t offset, int64_t numel,
                             torch::ScalarType dtype, v1::ReduceOp op,
                             const SharedBuffer* mirror = nullptr, int64_t mirror_offset = 0,
                             const SplitUpdate* update = nullptr,
                             const SharedBuffer* source = nullptr, int64_t source_offset = 0,
                             bool result_everywhere = true);
  SharedMemoryCollectiveBackend(std::unique_ptr<CollectiveBackend> inner, absl::Duration timeout);
  absl::Status Attach(const std::string& host);
  // Announces this rank's arrival and waits for every rank's (or fails, naming who is missing).
  absl::Status ArriveAndWait(const char* what);
  void WakeSleepers();
  absl::Status Poison(absl::Status status);
  // Whether the segment reduces `tensor` with `op` itself (floating point, int32, int64; sum,
  // mean, max, min).
  static bool ReducedHere(const torch::Tensor& tensor, v1::ReduceOp op);
  // Reduces `flat` through the slots, described as `kind` with `described` as its op; the
  // result lands in `flat` only if `lands_here` (a reduce's destination, every all_reduce rank).
  absl::Status ReduceChunks(torch::Tensor& flat, v1::ReduceOp op, int32_t kind, int32_t described,
                            bool lands_here);
  // Copies `bytes` at `data` on rank `src` to `data` on every other rank through the slots,
  // for call `call` (described already).
  absl::Status MoveBytes(uint64_t call, const char* what, int src, char* data, int64_t bytes);

  std::unique_ptr<CollectiveBackend> inner_;
  const absl::Duration timeout_;
  Segment* segment_ = nullptr;
  size_t mapped_bytes_ = 0;
  int64_t slot_bytes_ = 0;
  uint64_t arrivals_ = 0;  // this rank's arrivals so far
  uint64_t calls_ = 0;     // this rank's shared-memory collectives so far
  absl::Status broken_;
  std::string fallback_reason_;
  int world_ = 1;  // asked of the inner plane once: the wait loop checks it per spin
  // Whether every rank can have a core of this process's to itself: if not, a rank polling
  // for its peers would hold a core one of them needs, so waits sleep early.
  bool ranks_fit_cores_ = false;
  std::vector<std::shared_ptr<SharedBuffer>> shared_buffers_;
  int64_t inputs_read_in_place_ = 0;
};

}  // namespace dtrain

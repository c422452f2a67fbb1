// CollectiveBackend: the collectives a strategy needs (ddp, ddp_spawn, sharded), on torch
// tensors, behind one interface so that another engine (Gloo, shared memory) can plug in beside the
// coordinator's gRPC collectives. Every call has the ProcessGroup's deadline semantics: it
// fails loudly (a status naming the ranks involved) rather than hang.
//
// Thread-safety: as ProcessGroup; every rank issues the same calls in the same order.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/process_group.h"

namespace dtrain {

// broadcast_bytes carries messages (a checkpoint's name, an error, a pickled object), not tensors:
// a size a peer announces beyond this is refused before anything is allocated.
inline constexpr int64_t kMostBroadcastBytes = int64_t{1} << 30;

// The size rank `src` announced for a broadcast of bytes on `plane` ("gloo", "shm"): INTERNAL
// for a negative one (only a broken peer sends it), INVALID_ARGUMENT over kMostBroadcastBytes.
absl::Status CheckBroadcastBytesSize(const char* plane, int src, int64_t size);

class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;

  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;
  virtual int node_rank() const = 0;
  // The coordinator's verdict on the group: not OK once a member died or left (named).
  virtual absl::Status health() const = 0;

  virtual absl::Status Barrier(const std::string& name) = 0;
  // Overwrites `tensor` (same shape and dtype on every rank) with rank src's values.
  virtual absl::Status Broadcast(torch::Tensor& tensor, int src) = 0;
  // Rank src's bytes. The gloo and shm planes carry at most kMostBroadcastBytes, every rank
  // refusing a larger broadcast alike; the grpc plane has the coordinator's limits.
  virtual absl::StatusOr<std::string> BroadcastBytes(const std::string& bytes, int src) = 0;
  // Replaces `tensor` by the reduction over ranks.
  virtual absl::Status AllReduce(torch::Tensor& tensor, v1::ReduceOp op) = 0;
  // Every rank's tensor, in rank order (dimension 0 may differ).
  virtual absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& tensor) = 0;
  // The reduction lands in `tensor` on dst; other ranks' tensors are left alone.
  virtual absl::Status Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) = 0;
  virtual absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all) = 0;
  // Leaves the group cleanly, so the others see a departure rather than a death.
  virtual absl::Status Leave() = 0;

  // Whether AllReduce of CPU tensors is this thread's own CPU work (the shared-memory plane
  // reduces its peers' data itself) rather than mostly waiting on a network. ddp then does not
  // start buckets during backward: the reduction would only take the core from backward.
  virtual bool AllReduceComputesOnCaller() const { return false; }

  // Zeroed memory for a tensor this rank all-reduces again and again (ddp's gradient buckets).
  // A plane may place it where its peers read and write it directly, so that AllReduce of a
  // tensor lying in it copies nothing in or out; the default is ordinary memory. Collective
  // for planes that share memory: every rank calls it with the same arguments, in the same
  // order.
  virtual absl::StatusOr<torch::Tensor> AllocateForAllReduce(int64_t numel,
                                                             torch::ScalarType dtype);

  // An all_reduce of `tensor` whose ranks then share an update of `mirror` (a tensor of the
  // same numel and dtype; ddp's parameters beside their gradient bucket): `update(begin, end)`
  // runs on this rank for the elements [begin, end) it is to update, reading the reduced
  // `tensor` there and writing this rank's `mirror` there, and when the call returns every
  // rank's `mirror` holds every rank's updates. The default updates every element on every rank
  // (AllReduce, then update(0, numel)); a plane whose ranks share memory splits the elements
  // between them and copies each rank's part into the others' `mirror`, so that each rank
  // computes only its part. `update` must compute an element from that element alone. A failed
  // update fails the call on this rank, and where the ranks split the elements on every rank.
  // With `source` (same numel and dtype), this rank's contribution is read from there instead of
  // from `tensor`, and the result still lands in `tensor`: a plane whose ranks share memory then
  // reads `source` in place (ddp's gradients made in plane memory); the default copies it in.
  // With `result_everywhere` false, the reduced `tensor` need only be right on this rank where
  // this rank updates (a plane that splits the elements then writes no other rank's part of
  // it): for a caller whose reduced values nobody reads after the update.
  using SplitUpdate = std::function<absl::Status(int64_t begin, int64_t end)>;
  // Whether `tensor` (from AllocateForAllReduce) lies in memory the other ranks read and write.
  virtual bool SharedWithPeers(const torch::Tensor& tensor) const { return false; }
  virtual absl::Status AllReduceThenUpdate(torch::Tensor& tensor, v1::ReduceOp op,
                                           torch::Tensor& mirror, const SplitUpdate& update,
                                           const torch::Tensor& source = {},
                                           bool result_everywhere = true);

  // Ends this rank's wait in a collective, now or in the next one that has to wait, with `why`
  // until ClearInterrupt: the step was cancelled, and ranks stop at different batches, so a peer
  // may never join the collective this rank waits in. A collective cut short leaves the plane
  // broken (every later call fails); one that completes without waiting is unaffected. Any
  // thread may call these.
  virtual void Interrupt(absl::Status why) {
    absl::MutexLock lock(&interrupt_mu_);
    interrupt_ = std::move(why);
    interrupted_.store(true, std::memory_order_release);
  }
  virtual void ClearInterrupt() { interrupted_.store(false, std::memory_order_release); }

 protected:
  // AllReduceThenUpdate's INVALID_ARGUMENT unless its `what` (`other`: the mirror, the source)
  // holds as many elements of the same type as `tensor`.
  static absl::Status SameElements(const char* what, const torch::Tensor& other,
                                   const torch::Tensor& tensor);
  // OK unless interrupted.
  absl::Status interruption() const {
    if (!interrupted_.load(std::memory_order_acquire)) return absl::OkStatus();
    absl::MutexLock lock(&interrupt_mu_);
    return interrupt_;
  }

 private:
  std::atomic<bool> interrupted_{false};
  mutable absl::Mutex interrupt_mu_;
  absl::Status interrupt_ ABSL_GUARDED_BY(interrupt_mu_);
};

// Marks the calling thread, while alive, as one that waits in collectives beside compute on its
// own core (ddp's communication thread during backward): a plane that busy-polls for its peers
// gives such a thread's core back early. Other threads (the one that runs steps) have nothing
// else to run while they wait, so they poll longer: waking a sleeping vCPU costs more than the
// wait itself on a virtual machine.
class ScopedOverlappedWaits {
 public:
  ScopedOverlappedWaits();
  ~ScopedOverlappedWaits();
  ScopedOverlappedWaits(const ScopedOverlappedWaits&) = delete;
  ScopedOverlappedWaits& operator=(const ScopedOverlappedWaits&) = delete;
  static bool active();

 private:
  const bool was_;
};

// Every plane answers on the caller's device: a tensor that is not on the CPU (CUDA) travels
// through host memory, as ProcessGroupGloo's own CUDA path does (dtrain has no NCCL plane).
// RunOnHost runs `op` on `tensor` itself when it is on the CPU, else on a host copy whose result
// is copied back into it unless `lands_here` is false (a broadcast's source, a reduce's
// non-destination); AllGatherOnHost gathers a host copy of `tensor` with `gather` and moves the
// parts to its device; OnDeviceOf moves gathered results to `like`'s device. The copies are
// where a device's earlier asynchronous error surfaces: it becomes a status, never an exception.
absl::Status RunOnHost(torch::Tensor& tensor, const std::function<absl::Status(torch::Tensor&)>& op,
                       bool lands_here = true);
absl::StatusOr<std::vector<torch::Tensor>> AllGatherOnHost(
    const torch::Tensor& tensor,
    const std::function<absl::StatusOr<std::vector<torch::Tensor>>(const torch::Tensor&)>& gather);
absl::StatusOr<std::vector<torch::Tensor>> OnDeviceOf(std::vector<torch::Tensor> parts,
                                                      const torch::Tensor& like);

// A fingerprint of an all_gather's rows' shape (the dimensions after the first), the same in
// every process, so that the peer-to-peer planes can compare shapes through one integer: the
// ranks of an all_gather may differ in their first dimension only.
int64_t RowShapeFingerprint(c10::IntArrayRef row_shape);

// The coordinator's gRPC collectives (client/ProcessGroup).
class GrpcCollectiveBackend : public CollectiveBackend {
 public:
  explicit GrpcCollectiveBackend(std::unique_ptr<ProcessGroup> group)
      : owned_(std::move(group)), group_(owned_.get()) {}
  // Borrows a group the caller keeps alive (or hands over later with Adopt).
  explicit GrpcCollectiveBackend(ProcessGroup* group) : group_(group) {}
  // Takes ownership of the group this backend was made over.
  void Adopt(std::unique_ptr<ProcessGroup> group) { owned_ = std::move(group); }

  std::string name() const override { return "grpc"; }
  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->world_size(); }
  int local_rank() const override { return group_->local_rank(); }
  int node_rank() const override { return group_->node_rank(); }
  absl::Status health() const override { return group_->health(); }

  absl::Status Barrier(const std::string& name) override { return group_->Barrier(name); }
  absl::Status Broadcast(torch::Tensor& tensor, int src) override;
  absl::StatusOr<std::string> BroadcastBytes(const std::string& bytes, int src) override;
  absl::Status AllReduce(torch::Tensor& tensor, v1::ReduceOp op) override;
  absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& tensor) override;
  absl::Status Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) override;
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all) override {
    return group_->ReduceBooleanDecision(decision, all);
  }
  absl::Status Leave() override { return group_->Leave(); }
  // The coordinator's collectives are calls: interrupting cancels the one in flight.
  void Interrupt(absl::Status why) override {
    group_->Interrupt(why);
    CollectiveBackend::Interrupt(std::move(why));
  }
  void ClearInterrupt() override {
    group_->ClearInterrupt();
    CollectiveBackend::ClearInterrupt();
  }

  ProcessGroup& group() { return *group_; }

 private:
  std::unique_ptr<ProcessGroup> owned_;
  ProcessGroup* group_;
};

// A world of one: every collective is the identity. single_device and dp use it, so a
// strategy never needs a special case for "no group".
class LocalCollectiveBackend : public CollectiveBackend {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int node_rank() const override { return 0; }
  absl::Status health() const override { return absl::OkStatus(); }
  absl::Status Barrier(const std::string&) override { return absl::OkStatus(); }
  absl::Status Broadcast(torch::Tensor&, int src) override;
  absl::StatusOr<std::string> BroadcastBytes(const std::string& bytes, int src) override;
  absl::Status AllReduce(torch::Tensor& tensor, v1::ReduceOp op) override;
  absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& tensor) override {
    return std::vector<torch::Tensor>{tensor.clone()};
  }
  absl::Status Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) override;
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool) override { return decision; }
  absl::Status Leave() override { return absl::OkStatus(); }
};

}  // namespace dtrain

// The Gloo data plane: collectives peer to peer over libtorch's c10d::ProcessGroupGloo, for when
// the coordinator's star topology becomes the bottleneck. Membership, ranks and liveness still
// come from the coordinator's group (ProcessGroup: heartbeats, a dead member named), and Gloo's
// rendezvous goes through the coordinator's key-value store (CoordinatorStore), so no extra
// port is opened for it. Semantics match GrpcCollectiveBackend: mean is a sum divided by the
// world (integers narrower than 64 bits summed in int64, rounding toward zero), all_gather
// accepts different first dimensions and refuses, on every rank, rows of another shape.
//
// Thread-safety: as CollectiveBackend.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "worker/collectives/collective_backend.h"

namespace c10d {
class ProcessGroupGloo;
}

namespace dtrain {

// How Gloo's connections are set up.
struct GlooConnectOptions {
  // Bounds the connections' set-up alone (when shorter than the operations' timeout), so that
  // peers that cannot reach each other are known before a long collective timeout.
  absl::Duration timeout = absl::InfiniteDuration();
  // The caller agrees with the other ranks on what a failed set-up means (auto's fallback to
  // grpc), and that agreement names a rank that died meanwhile: a failure returns at once
  // instead of first awaiting the coordinator's verdict on the members.
  bool caller_agrees_on_failure = false;
};

class GlooCollectiveBackend : public CollectiveBackend {
 public:
  // Connects Gloo among `group`'s ranks. `coordinator` is the address `group` joined;
  // `timeout` bounds every Gloo operation (a hung peer fails the call, it does not hang it).
  static absl::StatusOr<std::unique_ptr<GlooCollectiveBackend>> Make(
      const std::string& coordinator, std::unique_ptr<ProcessGroup> group, absl::Duration timeout,
      const GlooConnectOptions& connect = {});
  // Borrows a group the caller keeps alive (or hands over later with Adopt).
  static absl::StatusOr<std::unique_ptr<GlooCollectiveBackend>> Make(
      const std::string& coordinator, ProcessGroup* group, absl::Duration timeout,
      const GlooConnectOptions& connect = {});
  // Takes ownership of the group this backend was made over.
  void Adopt(std::unique_ptr<ProcessGroup> group) { owned_ = std::move(group); }
  ~GlooCollectiveBackend() override;

  std::string name() const override { return "gloo"; }
  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->world_size(); }
  int local_rank() const override { return group_->local_rank(); }
  int node_rank() const override { return group_->node_rank(); }
  absl::Status health() const override { return group_->health(); }

  absl::Status Barrier(const std::string& name) override;
  absl::Status Broadcast(torch::Tensor& tensor, int src) override;
  absl::StatusOr<std::string> BroadcastBytes(const std::string& bytes, int src) override;
  absl::Status AllReduce(torch::Tensor& tensor, v1::ReduceOp op) override;
  absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& tensor) override;
  absl::Status Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) override;
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all) override;
  absl::Status Leave() override;

 private:
  GlooCollectiveBackend() = default;
  // Runs `body`; an exception becomes a status naming the dead member: Gloo itself only
  // sees a closed connection, so the coordinator's verdict is awaited (up to its heartbeat
  // timeout) to say who died, unless `await_verdict` is false.
  template <typename F>
  absl::Status Guard(const std::string& what, F&& body, bool await_verdict = true);
  // Starts a Gloo operation (`start` returns its Work) and waits for it, polling this rank's
  // interruption and the group's health. Any failure breaks the backend: later calls fail.
  template <typename F>
  absl::Status Run(const std::string& what, F&& start);
  // Gives up on an operation still in flight: breaks the backend with `why` (returned).
  absl::Status Abandon(absl::Status why);

  std::unique_ptr<ProcessGroup> owned_;
  ProcessGroup* group_ = nullptr;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
  absl::Status broken_;
};

}  // namespace dtrain

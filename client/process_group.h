// ProcessGroup: one rank's handle on a coordinator group, the C++ client library of dtrain's
// collectives (a c10d ProcessGroup-like API over gRPC). Workers use it; so can users' programs.
//
// Join() registers and blocks until the group forms; from then on a background thread sends
// heartbeats. Every collective has a deadline (the group's default or CallOptions::timeout);
// every failure comes back as a status whose message names the ranks involved:
//   FAILED_PRECONDITION  ranks disagree about this call (the message lists what each called)
//   DEADLINE_EXCEEDED    some ranks did not arrive in time (named)
//   ABORTED              a member died (named with its host); the group is unusable
//   INVALID_ARGUMENT     this call's own input is malformed
//   UNAVAILABLE          the coordinator is unreachable or shutting down
//
// Thread-safety: collectives are serialized by an internal lock and numbered in the order they
// take it; every rank must issue the same collectives in the same order (as with c10d).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/kv_client.h"
#include "client/session.h"
#include "client/tensor_stream.h"
#include "common/call_canceller.h"
#include "common/tensor.h"
#include "dtrain/v1/coordinator.grpc.pb.h"

namespace dtrain {

struct ProcessGroupOptions {
  std::string group;  // the group (job) id
  int world_size = 1;
  int min_world_size = 0;  // < world_size: elastic, formed after settle_timeout
  absl::Duration settle_timeout = absl::ZeroDuration();
  std::string host;       // empty: this machine's host name
  std::string order_key;  // orders ranks within a host (then arrival order)
  std::string name;       // how errors name this member (a worker's name); may be empty
  int local_devices = 1;
  int64_t generation = 0;  // 0: whichever generation is forming
  absl::Duration register_timeout = absl::Minutes(5);
  // Default deadline for this group's collectives; zero: the coordinator's default.
  absl::Duration collective_timeout = absl::ZeroDuration();
  // Tests turn this off to play a process that hangs without dying.
  bool send_heartbeats = true;
  uint64_t incarnation = 0;  // 0: random
  // Bearer token for this group's calls (a job's own, see jobs.proto); empty: the process's,
  // unless `only_given_token`.
  std::string token;
  // A worker's rank sets it: the rank presents the job's token or none, never its daemon's.
  bool only_given_token = false;
  // Cancels Join's wait for the group when its owner gives up (a worker whose Setup call was
  // cancelled); the join then fails CANCELLED. Null: only the deadline ends the wait.
  CallCanceller* cancel = nullptr;
  // false: assignment().members() stays empty (RegisterRequest.omit_members), for a member that
  // does not read the list; a group of N otherwise receives N^2 entries in all.
  bool member_list = true;
};

// All-reduces above this size travel as segments in flight together (see Segment in
// coordinator.proto); never more than kMaxSegmentsInFlight of them.
inline constexpr int64_t kSegmentBytes = int64_t{4} << 20;
inline constexpr int64_t kMaxSegmentsInFlight = 32;

// Per-call settings of a collective.
struct CollectiveOptions {
  absl::Duration timeout = absl::ZeroDuration();  // zero: the group's default
};

class ProcessGroup {
 public:
  using CallOptions = CollectiveOptions;

  // `address` is the coordinator's host:port. Collectives and heartbeats travel on separate
  // connections, so a multi-GiB transfer never delays the proof that this rank is alive.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Join(const std::string& address,
                                                            ProcessGroupOptions options);

  // Leaves the group (if not yet left) and stops heartbeats.
  ~ProcessGroup();

  int rank() const { return assignment_.rank(); }
  // The bearer token this group's calls carry (for more channels in the same group).
  const std::string& token() const { return options_.token; }
  int world_size() const { return assignment_.world_size(); }
  int local_rank() const { return assignment_.local_rank(); }
  int local_world_size() const { return assignment_.local_world_size(); }
  int node_rank() const { return assignment_.node_rank(); }
  int num_nodes() const { return assignment_.num_nodes(); }
  int64_t generation() const { return assignment_.generation(); }
  uint64_t incarnation() const { return assignment_.member().incarnation(); }
  const v1::RegisterResponse& assignment() const { return assignment_; }

  absl::Status Barrier(const std::string& name = "barrier", CallOptions options = CallOptions());

  // src passes its tensor; the other ranks pass nullptr. Everyone receives src's tensor.
  absl::StatusOr<HostTensor> Broadcast(int src, const HostTensor* tensor,
                                       CallOptions options = CallOptions());
  absl::StatusOr<std::string> BroadcastBytes(int src, const std::string* bytes,
                                             CallOptions options = CallOptions());

  // Every rank's tensor, in rank order. Dimension 0 may differ between ranks.
  absl::StatusOr<std::vector<HostTensor>> AllGather(const HostTensor& tensor,
                                                    CallOptions options = CallOptions());

  absl::StatusOr<HostTensor> AllReduce(const HostTensor& tensor, v1::ReduceOp op,
                                       CallOptions options = CallOptions());

  // As torch.distributed.all_reduce: the result replaces *tensor's data, received straight
  // into its buffer (no allocation, no extra copy). On error *tensor is unspecified.
  absl::Status AllReduceInPlace(HostTensor* tensor, v1::ReduceOp op,
                                CallOptions options = CallOptions());

  // The reduction on dst; std::nullopt on the other ranks.
  absl::StatusOr<std::optional<HostTensor>> Reduce(const HostTensor& tensor, v1::ReduceOp op,
                                                   int dst, CallOptions options = CallOptions());

  // all: true iff every rank decided true; otherwise true iff any did.
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all = true,
                                             CallOptions options = CallOptions());

  // The group's key-value scope (deleted when the group ends).
  KeyValueClient& store() { return *store_; }

  // Leaves cleanly; later calls answer FAILED_PRECONDITION.
  absl::Status Leave();

  // OK, or the error the last heartbeat got (e.g. ABORTED: a member died; FAILED_PRECONDITION:
  // the coordinator is shutting down, and the group ends with it); UNAVAILABLE once the
  // coordinator has answered no heartbeat for the heartbeat timeout (two intervals if it gave
  // none). Late or lost heartbeats before that leave it unchanged, and an answered one after a
  // verdict of UNAVAILABLE makes it OK again.
  absl::Status health() const;

  // Ends this rank's wait in a collective (a cancelled step's): the collective in flight, and
  // every one until ClearInterrupt, fails with `why`. The coordinator drops the abandoned
  // contribution and this rank is out of step with its peers, so every later collective fails
  // at once (FAILED_PRECONDITION), as on the other planes; a step is cancelled only when its
  // job is torn down or ends. Heartbeats and Leave are not affected. Any thread.
  void Interrupt(absl::Status why) { interrupt_.Cancel(std::move(why)); }
  void ClearInterrupt() { interrupt_.Reset(); }

  // (world_size, *shape) when every part has the same shape; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<HostTensor> Stack(const std::vector<HostTensor>& parts);
  // Concatenation along dimension 0, for parts whose first dimension differs.
  static absl::StatusOr<HostTensor> Concat(const std::vector<HostTensor>& parts);

 private:
  ProcessGroup(const std::string& address, ProcessGroupOptions options);
  void HeartbeatLoop();
  absl::Status Settle(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // A call cut short by Interrupt (CallCanceller::IsInterruption) reports Interrupt's reason,
  // naming the collective (`what`) and this rank, and puts the rank out of step.
  absl::Status Interrupted(absl::Status status, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // OK unless a collective was cut short (this rank is out of step): then why, for every call.
  absl::Status CheckInStep() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // A barrier or decision on the member's session stream (opened again after an error).
  absl::StatusOr<v1::SessionResponse> SessionCall(const v1::SessionRequest& request,
                                                  absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  absl::Status AllReduceInto(const HostTensor& tensor, v1::ReduceOp op, char* out,
                             CallOptions options) ABSL_LOCKS_EXCLUDED(call_mu_);
  // One tensor-collective stream (method "AllReduce", ...), with Settle applied on failure.
  absl::StatusOr<TensorStreamResult> Stream(const std::string& method,
                                            const google::protobuf::MessageLite& header,
                                            const std::string* payload, absl::Time deadline,
                                            std::string* into = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // Fills a CollectiveContext for the next collective and returns the transport deadline.
  absl::Time NextContext(const CallOptions& options, int64_t payload_bytes,
                         v1::CollectiveContext* context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);

  const std::string address_;               // the coordinator's, for messages
  std::shared_ptr<grpc::Channel> channel_;  // collectives and key-value
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;      // tensor streams, zero-copy framing
  std::unique_ptr<v1::Coordinator::Stub> control_;  // heartbeats, on their own connection
  ProcessGroupOptions options_;
  v1::RegisterResponse assignment_;
  std::unique_ptr<KeyValueClient> store_;

  CallCanceller interrupt_;  // the collective calls in flight register with it
  absl::Mutex call_mu_;
  int64_t next_sequence_ ABSL_GUARDED_BY(call_mu_) = 0;
  bool left_ ABSL_GUARDED_BY(call_mu_) = false;
  absl::Status cut_short_ ABSL_GUARDED_BY(call_mu_);  // the interrupted collective's error
  std::unique_ptr<Session> session_ ABSL_GUARDED_BY(call_mu_);

  mutable absl::Mutex health_mu_;
  absl::Status health_ ABSL_GUARDED_BY(health_mu_);
  absl::Notification stop_heartbeats_;
  std::thread heartbeat_thread_;
};

}  // namespace dtrain

// CollectiveEngine: matches the k-th collective call of every rank of a group, checks that
// they agree, computes the result once and hands the same bytes to every rank. It knows
// nothing of gRPC: calls arrive fully received, results leave through a callback.
//
// Failure rules (all loud, none silent):
// - ranks disagree about call k: FAILED_PRECONDITION to every rank of call k, listing what each
//   called; ranks that arrive later get the same error;
// - call k's deadline passes (counted from the first arrival): DEADLINE_EXCEEDED to those that
//   arrived, naming the missing ranks; late arrivals get the same error;
// - a rank's call is cancelled (its process died): ABORTED naming it, to the others of call k;
// - the group fails (GroupTable saw a member die): ABORTED with that reason, to every pending
//   and every later call;
// - a rank left: FAILED_PRECONDITION naming it, to calls it will never join.
//
// Thread-safety: all methods may be called from any thread; `done` callbacks run outside the
// engine's lock, on the thread of whichever call completed them, exactly once per Submit.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/bytes.h"
#include "coordinator/collectives/group_table.h"
#include "dtrain/v1/coordinator.pb.h"

namespace dtrain {

enum class CollectiveKind {
  kBarrier,
  kBroadcast,
  kAllGather,
  kReduce,
  kAllReduce,
  kReduceBooleanDecision,
};

std::string CollectiveKindName(CollectiveKind kind);

// One rank's call, with its payload fully received.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  v1::MemberRef member;
  int64_t sequence = 0;
  absl::Duration timeout = absl::ZeroDuration();  // zero: the group's default
  std::string barrier_name;
  int root = 0;  // broadcast src, reduce dst
  v1::ReduceOp reduce_op = v1::REDUCE_OP_UNSPECIFIED;
  v1::PayloadKind payload_kind = v1::PAYLOAD_KIND_TENSOR;
  bool decision = false;
  bool all = true;
  bool has_tensor = false;
  v1::TensorMeta meta;
  bool segmented = false;  // all_reduce of one segment of a larger tensor
  v1::Segment segment;
  std::shared_ptr<const Bytes> payload;
};

// What one rank receives. Tensor parts are shared between ranks, never copied per rank.
struct CollectiveResult {
  std::vector<v1::TensorMeta> parts;
  std::vector<std::shared_ptr<const Bytes>> buffers;  // parallel to parts
  bool decision = false;
};

using CollectiveDone =
    std::function<void(const absl::Status&, std::shared_ptr<const CollectiveResult>)>;

class CollectiveEngine {
 public:
  explicit CollectiveEngine(const GroupTable* groups);

  // Told of every completed collective (kind, payload bytes in, time since its first rank
  // arrived, outcome); for metrics. Set before the first Submit.
  using Observer = std::function<void(CollectiveKind, int64_t bytes, absl::Duration latency,
                                      const absl::Status& outcome)>;
  void SetObserver(Observer observer) { observer_ = std::move(observer); }

  // Validates `call` against its group and joins it into collective #sequence. `done` runs
  // once, with the result or one of the errors listed above.
  void Submit(CollectiveCall call, CollectiveDone done);

  // What Submit would refuse of `call` before its payload arrives: the member (group,
  // generation, incarnation, not failed or left), the call's arguments, and its sequence inside
  // the member's window. A stream checks this at its header, before it reserves the bytes the
  // header claims.
  absl::Status Admit(const CollectiveCall& call) const;

  // The member's call #sequence was cancelled by its transport (client gone).
  void Abandon(const v1::MemberRef& member, int64_t sequence);

  // GroupEvents handlers.
  void FailGroup(const std::string& group, int64_t generation, const absl::Status& reason);
  void MemberLeft(const std::string& group, int64_t generation, int rank, const std::string& who);
  void DropGroup(const std::string& group, int64_t generation);

  // Fails calls whose deadline passed. Returns whether calls still wait on a deadline.
  bool Tick(absl::Time now);

  // Fails everything pending with UNAVAILABLE; later calls fail the same way.
  void Stop();

  // Pending collective instances across groups (for tests and metrics).
  int PendingCount() const;
  // Calls submitted since start; a cheap activity signal for housekeeping.
  uint64_t SubmittedCount() const { return submitted_.load(std::memory_order_relaxed); }

  // Ranks of `group` (any generation) currently waiting inside a collective.
  int WaitingRanks(const std::string& group) const;

 private:
  struct Arrival {
    CollectiveCall call;
    CollectiveDone done;
  };
  struct Instance {
    int64_t sequence = 0;
    std::optional<CollectiveCall> first;  // the first arrival, without payload: the reference
    std::map<int, Arrival> arrivals;      // by rank, still waiting
    std::set<int> answered;               // ranks that already got an outcome
    absl::Time deadline = absl::InfiniteFuture();
    absl::Duration timeout;
    absl::Time started;  // the first rank's arrival
    std::optional<absl::Status> failure;
  };
  struct GroupState {
    int world_size = 0;
    std::shared_ptr<const std::vector<std::string>> member_labels;
    std::vector<int64_t> next_sequence;    // by rank: lowest number not yet used
    std::vector<std::set<int64_t>> ahead;  // by rank: numbers used above next_sequence
    std::map<int64_t, Instance> instances;
    std::optional<absl::Status> failure;
    std::map<int, std::string> left;  // rank -> who
  };
  using Key = std::pair<std::string, int64_t>;
  using Completion = std::function<void()>;

  // `with_payload` false: the call's payload has not arrived yet (Admit), so only its
  // description is checked.
  static absl::Status ValidateCall(const CollectiveCall& call, const MemberView& view,
                                   bool with_payload = true);
  static std::string Signature(const CollectiveCall& call);
  // Whether two calls may meet (what Signature prints, compared without formatting).
  static bool Matches(const CollectiveCall& a, const CollectiveCall& b);
  // "rank 0 called X; rank 1 called Y" over the instance's arrivals, for error messages.
  static std::string DescribeCalls(const Instance& instance);
  static std::string Describe(const CollectiveCall& call);
  std::string Label(const Key& key, const Instance& instance) const;
  // Answers every waiting rank of `instance` with `status`; keeps the failure for later ones.
  void FailInstance(GroupState& group, Instance& instance, const absl::Status& status,
                    std::vector<Completion>& completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops instances every rank has heard from.
  void Collect(GroupState& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(Instance instance, int world_size);

  const GroupTable* const groups_;
  std::atomic<uint64_t> submitted_{0};
  Observer observer_;
  mutable absl::Mutex mu_;
  std::map<Key, GroupState> states_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dtrain

#include "coordinator/collectives/collective_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "coordinator/collectives/reduction.h"

namespace dtrain {
namespace {

constexpr size_t kMaxBarrierName = 256;
constexpr size_t kMaxNamedRanks = 16;
constexpr int kMaxSegments = 1 << 16;
// Collectives one rank may have in flight at once (segments of one large all_reduce).
constexpr int64_t kSequenceWindow = 64;

const std::shared_ptr<const CollectiveResult>& EmptyResult() {
  static const auto* empty =
      new std::shared_ptr<const CollectiveResult>(std::make_shared<CollectiveResult>());
  return *empty;
}

std::string BoolName(bool b) { return b ? "true" : "false"; }

// "rank 2 (worker 'w2' on host a), rank 5 (host b) and 3 more"
std::string NameRanks(const std::vector<int>& ranks,
                      const std::shared_ptr<const std::vector<std::string>>& label_list) {
  static const std::vector<std::string> kNone;
  const std::vector<std::string>& labels = label_list ? *label_list : kNone;
  std::vector<std::string> names;
  for (size_t i = 0; i < ranks.size() && i < kMaxNamedRanks; ++i) {
    const int r = ranks[i];
    names.push_back(absl::StrCat("rank ", r, " (",
                                 r < static_cast<int>(labels.size()) ? labels[r] : "host ?", ")"));
  }
  std::string out = absl::StrJoin(names, ", ");
  if (ranks.size() > kMaxNamedRanks) {
    absl::StrAppend(&out, " and ", ranks.size() - kMaxNamedRanks, " more");
  }
  return out;
}

}  // namespace

std::string CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceBooleanDecision:
      return "reduce_boolean_decision";
  }
  return "unknown";
}

CollectiveEngine::CollectiveEngine(const GroupTable* groups) : groups_(groups) {}

absl::Status CollectiveEngine::ValidateCall(const CollectiveCall& call, const MemberView& view,
                                            bool with_payload) {
  const std::string what = CollectiveKindName(call.kind);
  if (call.sequence < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": sequence must not be negative, got ", call.sequence));
  }
  if (call.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": timeout must not be negative"));
  }
  const bool rooted =
      call.kind == CollectiveKind::kBroadcast || call.kind == CollectiveKind::kReduce;
  if (rooted && (call.root < 0 || call.root >= view.world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", call.kind == CollectiveKind::kBroadcast ? "src" : "dst", " rank ",
                     call.root, " is out of range for world size ", view.world_size));
  }
  bool needs_tensor = call.kind == CollectiveKind::kAllGather ||
                      call.kind == CollectiveKind::kReduce ||
                      call.kind == CollectiveKind::kAllReduce;
  switch (call.kind) {
    case CollectiveKind::kBarrier:
      if (call.barrier_name.empty()) {
        return absl::InvalidArgumentError("barrier: name is empty; give every barrier a name");
      }
      if (call.barrier_name.size() > kMaxBarrierName) {
        return absl::InvalidArgumentError("barrier: name is longer than 256 bytes");
      }
      break;
    case CollectiveKind::kBroadcast:
      if (call.payload_kind != v1::PAYLOAD_KIND_TENSOR &&
          call.payload_kind != v1::PAYLOAD_KIND_BYTES) {
        return absl::InvalidArgumentError(
            "broadcast: payload kind must be PAYLOAD_KIND_TENSOR or PAYLOAD_KIND_BYTES");
      }
      if (view.rank == call.root) {
        needs_tensor = true;
        if (call.payload_kind == v1::PAYLOAD_KIND_BYTES &&
            (call.meta.dtype() != v1::DTYPE_UINT8 || call.meta.shape_size() != 1)) {
          return absl::InvalidArgumentError(
              "broadcast: opaque bytes must be described as uint8[n]");
        }
      } else if (call.has_tensor) {
        return absl::InvalidArgumentError(absl::StrCat("broadcast: rank ", view.rank,
                                                       " is not src (", call.root,
                                                       ") and must not send a payload"));
      }
      break;
    case CollectiveKind::kReduce:
    case CollectiveKind::kAllReduce:
      if (absl::Status s = CheckReducible(call.meta.dtype(), call.reduce_op); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
      }
      break;
    default:
      break;
  }
  if (call.segmented) {
    const v1::Segment& seg = call.segment;
    if (call.kind != CollectiveKind::kAllReduce) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": only all_reduce takes segments"));
    }
    if (seg.count() < 1 || seg.count() > kMaxSegments || seg.index() < 0 ||
        seg.index() >= seg.count()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": segment ", seg.index(), " of ",
                                                     seg.count(), " is out of range (at most ",
                                                     kMaxSegments, " segments)"));
    }
    if (absl::Status s = ValidateMeta(seg.whole()).status(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": segment's whole tensor: ", s.message()));
    }
    if (seg.whole().dtype() != call.meta.dtype() || call.meta.shape_size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a segment must be a 1-d range of its whole tensor's dtype, got ",
                       DescribeMeta(call.meta), " of ", DescribeMeta(seg.whole())));
    }
  }
  if (needs_tensor) {
    if (!call.has_tensor || (with_payload && call.payload == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the call carries no tensor"));
    }
    if (!with_payload) return absl::OkStatus();
    if (absl::Status s = ValidatePayload(call.meta, static_cast<int64_t>(call.payload->size()));
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string CollectiveEngine::Signature(const CollectiveCall& call) {
  const std::string name = CollectiveKindName(call.kind);
  switch (call.kind) {
    case CollectiveKind::kBarrier:
      return absl::StrCat(name, "('", call.barrier_name, "')");
    case CollectiveKind::kBroadcast:
      return absl::StrCat(name, "(src=", call.root, ", ",
                          call.payload_kind == v1::PAYLOAD_KIND_BYTES ? "bytes" : "tensor", ")");
    case CollectiveKind::kAllGather: {
      // Dimension 0 may differ between ranks; everything else must agree.
      std::vector<std::string> dims;
      for (int i = 0; i < call.meta.shape_size(); ++i) {
        dims.push_back(i == 0 ? "?" : absl::StrCat(call.meta.shape(i)));
      }
      return absl::StrCat(name, "(", DTypeName(call.meta.dtype()), "[", absl::StrJoin(dims, ", "),
                          "])");
    }
    case CollectiveKind::kReduce:
      return absl::StrCat(name, "(", DescribeMeta(call.meta), ", ", ReduceOpName(call.reduce_op),
                          ", dst=", call.root, ")");
    case CollectiveKind::kAllReduce:
      if (call.segmented) {
        return absl::StrCat(name, "(", DescribeMeta(call.segment.whole()), ", ",
                            ReduceOpName(call.reduce_op), ", segment ", call.segment.index() + 1,
                            " of ", call.segment.count(), ")");
      }
      return absl::StrCat(name, "(", DescribeMeta(call.meta), ", ", ReduceOpName(call.reduce_op),
                          ")");
    case CollectiveKind::kReduceBooleanDecision:
      return absl::StrCat(name, "(all=", BoolName(call.all), ")");
  }
  return name;
}

std::string CollectiveEngine::Describe(const CollectiveCall& call) {
  if (call.kind == CollectiveKind::kAllGather) {
    return absl::StrCat(CollectiveKindName(call.kind), "(", DescribeMeta(call.meta), ")");
  }
  return Signature(call);
}

std::string CollectiveEngine::Label(const Key& key, const Instance& instance) const {
  return absl::StrCat("collective #", instance.sequence, " (",
                      instance.first.has_value() ? Signature(*instance.first) : "no call yet",
                      ") of group '", key.first, "' generation ", key.second);
}

bool CollectiveEngine::Matches(const CollectiveCall& a, const CollectiveCall& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case CollectiveKind::kBarrier:
      return a.barrier_name == b.barrier_name;
    case CollectiveKind::kBroadcast:
      return a.root == b.root && a.payload_kind == b.payload_kind;
    case CollectiveKind::kReduceBooleanDecision:
      return a.all == b.all;
    case CollectiveKind::kAllGather:
      // Dimension 0 may differ; dtype and the other dimensions must agree.
      if (a.meta.dtype() != b.meta.dtype() || a.meta.shape_size() != b.meta.shape_size()) {
        return false;
      }
      for (int i = 1; i < a.meta.shape_size(); ++i) {
        if (a.meta.shape(i) != b.meta.shape(i)) return false;
      }
      return true;
    case CollectiveKind::kReduce:
    case CollectiveKind::kAllReduce:
      if (a.root != b.root && a.kind == CollectiveKind::kReduce) return false;
      if (a.segmented != b.segmented) return false;
      if (a.segmented) {
        const v1::TensorMeta& wa = a.segment.whole();
        const v1::TensorMeta& wb = b.segment.whole();
        if (a.segment.index() != b.segment.index() || a.segment.count() != b.segment.count() ||
            wa.shape_size() != wb.shape_size()) {
          return false;
        }
        for (int i = 0; i < wa.shape_size(); ++i) {
          if (wa.shape(i) != wb.shape(i)) return false;
        }
      }
      if (a.reduce_op != b.reduce_op || a.meta.dtype() != b.meta.dtype() ||
          a.meta.shape_size() != b.meta.shape_size()) {
        return false;
      }
      for (int i = 0; i < a.meta.shape_size(); ++i) {
        if (a.meta.shape(i) != b.meta.shape(i)) return false;
      }
      return true;
  }
  return false;
}

std::string CollectiveEngine::DescribeCalls(const Instance& instance) {
  std::vector<std::string> calls;
  for (const auto& [rank, arrival] : instance.arrivals) {
    calls.push_back(absl::StrCat("rank ", rank, " called ", Describe(arrival.call)));
  }
  return absl::StrJoin(calls, "; ");
}

void CollectiveEngine::FailInstance(GroupState& group, Instance& instance,
                                    const absl::Status& status,
                                    std::vector<Completion>& completions) {
  instance.failure = status;
  for (auto& [rank, arrival] : instance.arrivals) {
    completions.push_back([done = std::move(arrival.done), status] { done(status, nullptr); });
    instance.answered.insert(rank);
  }
  instance.arrivals.clear();
}

void CollectiveEngine::Collect(GroupState& group) {
  for (auto it = group.instances.begin(); it != group.instances.end();) {
    if (it->second.failure.has_value() &&
        static_cast<int>(it->second.answered.size()) >= group.world_size) {
      it = group.instances.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status CollectiveEngine::Admit(const CollectiveCall& call) const {
  DTRAIN_ASSIGN_OR_RETURN(MemberView view, groups_->CheckMember(call.member));
  DTRAIN_RETURN_IF_ERROR(ValidateCall(call, view, /*with_payload=*/false));
  absl::MutexLock lock(&mu_);
  auto it = states_.find(Key{view.group, view.generation});
  if (it == states_.end() || it->second.world_size == 0) {
    return call.sequence < kSequenceWindow
               ? absl::OkStatus()
               : absl::FailedPreconditionError(absl::StrCat(
                     "rank ", view.rank, " of group '", view.group, "' sent collective #",
                     call.sequence, ", but its next collective is #0 (at most ", kSequenceWindow,
                     " in flight)"));
  }
  const GroupState& group = it->second;
  if (group.failure.has_value()) return *group.failure;
  const int64_t next = group.next_sequence[view.rank];
  if (call.sequence < next || call.sequence >= next + kSequenceWindow ||
      group.ahead[view.rank].count(call.sequence)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", view.rank, " of group '", view.group, "' sent collective #", call.sequence,
        ", but its next collective is #", next, " (at most ", kSequenceWindow, " in flight)"));
  }
  return absl::OkStatus();
}

void CollectiveEngine::Submit(CollectiveCall call, CollectiveDone done) {
  submitted_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<MemberView> view = groups_->CheckMember(call.member);
  if (!view.ok()) return done(view.status(), nullptr);
  if (absl::Status s = ValidateCall(call, *view); !s.ok()) return done(s, nullptr);

  const absl::Time now = groups_->options().clock();
  const Key key{view->group, view->generation};
  const int rank = view->rank;
  std::vector<Completion> completions;
  std::optional<Instance> ready;
  int world_size = view->world_size;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      completions.push_back(
          [done] { done(absl::UnavailableError("the coordinator is shutting down"), nullptr); });
    } else {
      GroupState& group = states_[key];
      if (group.world_size == 0) {
        group.world_size = view->world_size;
        group.member_labels = view->member_labels;
        group.next_sequence.assign(view->world_size, 0);
        group.ahead.assign(view->world_size, {});
      }
      const int64_t next = group.next_sequence[rank];
      if (group.failure.has_value()) {
        completions.push_back([done, status = *group.failure] { done(status, nullptr); });
      } else if (call.sequence < next || call.sequence >= next + kSequenceWindow ||
                 group.ahead[rank].count(call.sequence)) {
        completions.push_back(
            [done,
             msg = absl::StrCat("rank ", rank, " of group '", key.first, "' sent ", Describe(call),
                                " as collective #", call.sequence, ", but its next collective is #",
                                next, " (at most ", kSequenceWindow,
                                " in flight). Each rank must number its collectives "
                                "in program order, each number once")] {
              done(absl::FailedPreconditionError(msg), nullptr);
            });
      } else {
        // Numbers may arrive slightly out of order (segments in flight at once); the window
        // advances over every number used.
        std::set<int64_t>& ahead = group.ahead[rank];
        ahead.insert(call.sequence);
        while (!ahead.empty() && *ahead.begin() == group.next_sequence[rank]) {
          ahead.erase(ahead.begin());
          group.next_sequence[rank] += 1;
        }
        auto [it, created] = group.instances.try_emplace(call.sequence);
        Instance& inst = it->second;
        const absl::Duration timeout =
            call.timeout > absl::ZeroDuration() ? call.timeout : view->collective_timeout;
        if (created) {
          inst.sequence = call.sequence;
          inst.timeout = timeout;
          // A rank that left before this call can never join it.
          for (const auto& [left_rank, who] : group.left) {
            if (group.next_sequence[left_rank] <= call.sequence) {
              inst.failure = absl::FailedPreconditionError(absl::StrCat(
                  who, " left group '", key.first, "' before joining ", Label(key, inst)));
              break;
            }
          }
        }
        if (inst.failure.has_value()) {
          inst.answered.insert(rank);
          absl::Status status = *inst.failure;
          if (status.code() == absl::StatusCode::kFailedPrecondition && inst.first.has_value()) {
            status =
                absl::Status(status.code(), absl::StrCat(status.message(), "; rank ", rank,
                                                         " arrived later with ", Describe(call)));
          }
          completions.push_back([done, status] { done(status, nullptr); });
          Collect(group);
        } else {
          if (now + timeout < inst.deadline) {
            inst.deadline = now + timeout;
            inst.timeout = timeout;
          }
          if (!inst.first.has_value()) {
            inst.first = call;
            inst.first->payload = nullptr;
            inst.started = now;
          }
          const bool matches = Matches(*inst.first, call);
          inst.arrivals.emplace(rank, Arrival{std::move(call), std::move(done)});
          if (!matches) {
            FailInstance(group, inst,
                         absl::FailedPreconditionError(absl::StrCat(
                             "collective #", inst.sequence, " of group '", key.first,
                             "' does not match across ranks: ", DescribeCalls(inst),
                             ". Every rank must make the same collective calls in the same "
                             "order")),
                         completions);
            Collect(group);
          } else if (static_cast<int>(inst.arrivals.size()) == group.world_size) {
            ready = std::move(inst);
            group.instances.erase(it);
          }
        }
      }
    }
  }
  for (Completion& c : completions) c();
  if (ready.has_value()) Complete(std::move(*ready), world_size);
}

void CollectiveEngine::Complete(Instance instance, int world_size) {
  auto& arrivals = instance.arrivals;
  const CollectiveCall& first = arrivals.begin()->second.call;
  auto result = std::make_shared<CollectiveResult>();
  absl::Status status;
  switch (first.kind) {
    case CollectiveKind::kBarrier:
      break;
    case CollectiveKind::kReduceBooleanDecision: {
      bool decision = first.all;
      for (const auto& [rank, a] : arrivals) {
        decision = first.all ? (decision && a.call.decision) : (decision || a.call.decision);
      }
      result->decision = decision;
      break;
    }
    case CollectiveKind::kBroadcast: {
      const CollectiveCall& src = arrivals.at(first.root).call;
      result->parts.push_back(src.meta);
      result->buffers.push_back(src.payload);
      break;
    }
    case CollectiveKind::kAllGather:
      for (const auto& [rank, a] : arrivals) {
        result->parts.push_back(a.call.meta);
        result->buffers.push_back(a.call.payload);
      }
      break;
    case CollectiveKind::kReduce:
    case CollectiveKind::kAllReduce: {
      std::vector<const char*> inputs;
      inputs.reserve(arrivals.size());
      for (const auto& [rank, a] : arrivals) inputs.push_back(a.call.payload->data());
      auto out = std::make_shared<Bytes>(first.payload->size());
      int64_t numel = 1;
      for (int64_t d : first.meta.shape()) numel *= d;
      status = ReduceBuffers(first.meta.dtype(), first.reduce_op, inputs, numel, out->data());
      result->parts.push_back(first.meta);
      result->buffers.push_back(std::move(out));
      break;
    }
  }
  if (observer_) {
    int64_t bytes = 0;
    for (const auto& [rank, a] : arrivals)
      bytes += a.call.payload != nullptr ? a.call.payload->size() : 0;
    observer_(first.kind, bytes, groups_->options().clock() - instance.started, status);
  }
  // Inputs are no longer needed; release them before the (possibly slow) streaming back.
  const bool rooted_reduce = first.kind == CollectiveKind::kReduce;
  const int root = first.root;
  std::vector<std::pair<int, CollectiveDone>> dones;
  for (auto& [rank, a] : arrivals) dones.emplace_back(rank, std::move(a.done));
  if (first.kind == CollectiveKind::kReduce || first.kind == CollectiveKind::kAllReduce) {
    arrivals.clear();
  }
  std::shared_ptr<const CollectiveResult> shared = std::move(result);
  for (auto& [rank, done] : dones) {
    if (!status.ok()) {
      done(status, nullptr);
    } else if (rooted_reduce && rank != root) {
      done(absl::OkStatus(), EmptyResult());
    } else {
      done(absl::OkStatus(), shared);
    }
  }
}

void CollectiveEngine::Abandon(const v1::MemberRef& member, int64_t sequence) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto state = states_.find(Key{member.group(), member.generation()});
    if (state == states_.end()) return;
    GroupState& group = state->second;
    auto it = group.instances.find(sequence);
    if (it == group.instances.end()) return;
    Instance& inst = it->second;
    auto arrival = inst.arrivals.find(member.rank());
    if (arrival == inst.arrivals.end() ||
        arrival->second.call.member.incarnation() != member.incarnation()) {
      return;
    }
    const std::string who = NameRanks({member.rank()}, group.member_labels);
    FailInstance(group, inst,
                 absl::AbortedError(absl::StrCat(
                     who, " abandoned ", Label(Key{member.group(), member.generation()}, inst),
                     ": its call was cancelled (its process died or its client gave up)")),
                 completions);
    Collect(group);
  }
  for (Completion& c : completions) c();
}

void CollectiveEngine::FailGroup(const std::string& group_id, int64_t generation,
                                 const absl::Status& reason) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    GroupState& group = states_[Key{group_id, generation}];
    group.failure = reason;
    for (auto& [seq, inst] : group.instances) FailInstance(group, inst, reason, completions);
    group.instances.clear();
  }
  for (Completion& c : completions) c();
}

void CollectiveEngine::MemberLeft(const std::string& group_id, int64_t generation, int rank,
                                  const std::string& who) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto state = states_.find(Key{group_id, generation});
    if (state == states_.end()) {
      // No collective yet: remember the departure for the first one.
      state = states_.emplace(Key{group_id, generation}, GroupState{}).first;
    }
    GroupState& group = state->second;
    group.left[rank] = who;
    for (auto& [seq, inst] : group.instances) {
      if (inst.failure.has_value() || inst.arrivals.count(rank) || inst.answered.count(rank)) {
        continue;
      }
      FailInstance(group, inst,
                   absl::FailedPreconditionError(
                       absl::StrCat(who, " left group '", group_id, "' before joining ",
                                    Label(Key{group_id, generation}, inst))),
                   completions);
    }
  }
  for (Completion& c : completions) c();
}

void CollectiveEngine::DropGroup(const std::string& group_id, int64_t generation) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto state = states_.find(Key{group_id, generation});
    if (state == states_.end()) return;
    for (auto& [seq, inst] : state->second.instances) {
      FailInstance(state->second, inst,
                   absl::FailedPreconditionError(
                       absl::StrCat("group '", group_id, "' generation ", generation, " ended")),
                   completions);
    }
    states_.erase(state);
  }
  for (Completion& c : completions) c();
}

bool CollectiveEngine::Tick(absl::Time now) {
  std::vector<Completion> completions;
  bool waiting = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, group] : states_) {
      for (auto& [seq, inst] : group.instances) {
        // A failed instance kept until every rank has its answer waits on no deadline.
        if (inst.failure.has_value() || inst.arrivals.empty()) continue;
        if (now < inst.deadline) {
          waiting = true;
          continue;
        }
        std::vector<int> missing;
        for (int r = 0; r < group.world_size; ++r) {
          if (!inst.arrivals.count(r) && !inst.answered.count(r)) missing.push_back(r);
        }
        FailInstance(
            group, inst,
            absl::DeadlineExceededError(absl::StrCat(
                Label(key, inst), " timed out after ", absl::FormatDuration(inst.timeout), ": ",
                group.world_size - static_cast<int>(missing.size()), " of ", group.world_size,
                " ranks arrived; missing: ", NameRanks(missing, group.member_labels))),
            completions);
      }
      Collect(group);
    }
  }
  for (Completion& c : completions) c();
  return waiting;
}

void CollectiveEngine::Stop() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [key, group] : states_) {
      for (auto& [seq, inst] : group.instances) {
        // Named, so that a rank waiting in several places knows which call ended.
        FailInstance(group, inst,
                     absl::UnavailableError(
                         absl::StrCat(Label(key, inst), ": the coordinator is shutting down")),
                     completions);
      }
      group.instances.clear();
    }
  }
  for (Completion& c : completions) c();
}

int CollectiveEngine::PendingCount() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, group] : states_) n += static_cast<int>(group.instances.size());
  return n;
}

int CollectiveEngine::WaitingRanks(const std::string& group_id) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, group] : states_) {
    if (key.first != group_id) continue;
    for (const auto& [seq, inst] : group.instances) n += static_cast<int>(inst.arrivals.size());
  }
  return n;
}

}  // namespace dtrain

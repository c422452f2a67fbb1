#include "coordinator/collectives/coordinator_service.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/callback_reactors.h"
#include "common/grpc_status.h"
#include "common/key_page.h"
#include "common/raw_request.h"
#include "common/status_macros.h"
#include "common/streaming.h"
#include "common/tensor.h"
#include "common/tensor_frames.h"

namespace dtrain {
namespace {

// A unary reactor finished later by whoever completes the call; OnCancel lets the waiting
// side learn that the client went away (its process died, or it gave up).

}  // namespace

// Open tensor streams, in total and per member: each may hold the bytes its header claims until
// its payload arrives, so neither a caller that opens streams and sends nothing nor one member
// may have many. A member has at most 64 collectives in flight (the engine's window): twice
// that is room for segments and retries.
class StreamSlots {
 public:
  // Far above real use (128 ranks with 32 segments of one all_reduce in flight each make 4,096);
  // the per-member cap is what bounds one caller.
  static constexpr int kMaxStreams = 65536;
  static constexpr int kMaxStreamsPerMember = 128;

  absl::Status TakeOne() {
    if (open_.fetch_add(1) >= kMaxStreams) {
      open_.fetch_sub(1);
      return absl::ResourceExhaustedError(
          absl::StrCat("the coordinator has ", kMaxStreams, " collective streams open, its limit"));
    }
    return absl::OkStatus();
  }
  void GiveOne() { open_.fetch_sub(1); }

  absl::Status TakeForMember(const std::string& member) {
    absl::MutexLock lock(&mu_);
    int& mine = per_member_[member];
    if (mine >= kMaxStreamsPerMember) {
      return absl::ResourceExhaustedError(
          absl::StrCat("member ", member, " has ", kMaxStreamsPerMember,
                       " collective streams open, its limit; finish or cancel some first"));
    }
    ++mine;
    return absl::OkStatus();
  }
  void GiveForMember(const std::string& member) {
    absl::MutexLock lock(&mu_);
    auto it = per_member_.find(member);
    if (it != per_member_.end() && --it->second <= 0) per_member_.erase(it);
  }

 private:
  std::atomic<int> open_{0};
  absl::Mutex mu_;
  std::map<std::string, int> per_member_ ABSL_GUARDED_BY(mu_);
};

namespace {

void FillContext(const v1::CollectiveContext& context, CollectiveCall* call) {
  call->member = context.member();
  call->sequence = context.sequence();
  call->timeout = absl::Milliseconds(context.timeout_ms());
}

// How each streamed collective's first message maps onto a CollectiveCall.
struct BroadcastTraits {
  static constexpr char kName[] = "broadcast";
  using Header = v1::BroadcastHeader;
  static void Parse(const Header& h, CollectiveCall* call) {
    call->kind = CollectiveKind::kBroadcast;
    FillContext(h.context(), call);
    call->root = h.src();
    call->payload_kind = h.kind();
    call->has_tensor = h.has_meta();
    call->meta = h.meta();
  }
};
struct AllGatherTraits {
  static constexpr char kName[] = "all_gather";
  using Header = v1::AllGatherHeader;
  static void Parse(const Header& h, CollectiveCall* call) {
    call->kind = CollectiveKind::kAllGather;
    FillContext(h.context(), call);
    call->has_tensor = true;
    call->meta = h.meta();
  }
};
struct ReduceTraits {
  static constexpr char kName[] = "reduce";
  using Header = v1::ReduceHeader;
  static void Parse(const Header& h, CollectiveCall* call) {
    call->kind = CollectiveKind::kReduce;
    FillContext(h.context(), call);
    call->root = h.dst();
    call->reduce_op = h.op();
    call->has_tensor = true;
    call->meta = h.meta();
  }
};
struct AllReduceTraits {
  static constexpr char kName[] = "all_reduce";
  using Header = v1::AllReduceHeader;
  static void Parse(const Header& h, CollectiveCall* call) {
    call->kind = CollectiveKind::kAllReduce;
    FillContext(h.context(), call);
    call->reduce_op = h.op();
    call->segmented = h.has_segment();
    call->segment = h.segment();
    call->has_tensor = true;
    call->meta = h.meta();
  }
};

// One streamed tensor collective: receive header and chunks, submit, stream the result back.
// Lifetime: deletes itself in OnDone, which gRPC calls only after Finish; Finish is called
// exactly once, by the read path before submission or by the result path after it.
template <typename Traits>
class TensorCollectiveReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      private FrameSink {
 public:
  TensorCollectiveReactor(CollectiveEngine* engine, StreamSlots* slots,
                          absl::StatusOr<Caller> caller)
      : engine_(engine), slots_(slots), caller_(std::move(caller)) {
    if (!caller_.ok()) {
      Finish(caller_.status());
      return;
    }
    if (absl::Status room = slots_->TakeOne(); !room.ok()) {
      Finish(room);
      return;
    }
    holds_slot_ = true;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (!header_seen_)
        return Finish(absl::InvalidArgumentError("stream closed before its header"));
      return Finish(absl::InvalidArgumentError(
          absl::StrCat("stream closed after ", payload_.received(), " of the ", payload_.expected(),
                       " payload bytes of ", DescribeMeta(call_.meta))));
    }
    if (absl::Status s = ReadFrame(&request_, header_seen_, &header_, this); !s.ok()) {
      return Finish(s);
    }
    request_.Clear();
    if (payload_.received() < payload_.expected()) {
      StartRead(&request_);
      return;
    }
    call_.payload = std::move(buffer_);
    submitted_.store(true);
    engine_->Submit(std::move(call_), [this](const absl::Status& status,
                                             std::shared_ptr<const CollectiveResult> result) {
      OnResult(status, std::move(result));
    });
  }

  void OnWriteDone(bool ok) override {
    if (finished_) return;
    if (!ok) return Finish(absl::CancelledError("the client stopped reading the result"));
    WriteNext();
  }

  void OnCancel() override {
    if (submitted_.load() && !answered_.load()) engine_->Abandon(member_, sequence_);
  }

  void OnDone() override {
    if (holds_slot_) slots_->GiveOne();
    if (!member_slot_.empty()) slots_->GiveForMember(member_slot_);
    delete this;
  }

 private:
  absl::Status OnHeader() override {
    header_seen_ = true;
    Traits::Parse(header_, &call_);
    DTRAIN_RETURN_IF_ERROR(caller_->MayUseGroup(call_.member.group(), Traits::kName));
    member_ = call_.member;
    sequence_ = call_.sequence;
    if (call_.has_tensor) {
      absl::StatusOr<int64_t> bytes = ValidateMeta(call_.meta);
      if (!bytes.ok()) return bytes.status();
      payload_.Expect(static_cast<uint64_t>(*bytes));
    }
    // Whatever Submit would refuse is refused before anything the header claims is reserved.
    DTRAIN_RETURN_IF_ERROR(engine_->Admit(call_));
    const std::string member = absl::StrCat("rank ", member_.rank(), " of group '", member_.group(),
                                            "' generation ", member_.generation());
    DTRAIN_RETURN_IF_ERROR(slots_->TakeForMember(member));
    member_slot_ = member;
    // Uninitialized: for a large claim the pages are committed only as payload arrives, so a
    // header alone that claims gigabytes costs address space, not memory.
    buffer_ = Bytes::TryAllocate(static_cast<size_t>(payload_.expected()));
    if (buffer_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("the coordinator cannot reserve ",
                                                       payload_.expected(), " bytes for ",
                                                       DescribeMeta(call_.meta)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<char*> Reserve(int64_t bytes) override {
    absl::StatusOr<uint64_t> at = payload_.Advance(bytes);
    if (!at.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at.status().message(), " (",
          call_.has_tensor ? DescribeMeta(call_.meta) : std::string("a call without tensor"), ")"));
    }
    return buffer_->data() + *at;
  }

  void OnResult(const absl::Status& status, std::shared_ptr<const CollectiveResult> result) {
    answered_.store(true);
    if (!status.ok()) return Finish(status);
    result_ = std::move(result);
    for (const auto& buffer : result_->buffers) remaining_ += buffer->size();
    WriteNext();
  }

  // Writes the next message: the header first, then up to one chunk of payload, possibly
  // spanning several parts (an all_gather of small tensors travels in one message). The
  // payload is referenced, not copied.
  void WriteNext() {
    v1::ResultHeader header;
    const bool first = !header_sent_;
    if (first) {
      header_sent_ = true;
      for (const auto& meta : result_->parts) *header.add_parts() = meta;
    }
    std::vector<PayloadRange> ranges;
    // Header, payload and framing (two tags, two varints) stay within a default client's limit;
    // a header too large to share a message with payload goes alone.
    constexpr int64_t kFraming = 16;
    const int64_t room = first ? kDefaultClientMaxMessageBytes -
                                     static_cast<int64_t>(header.ByteSizeLong()) - kFraming
                               : kStreamChunkBytes;
    const size_t budget = static_cast<size_t>(std::min<uint64_t>(
        remaining_, static_cast<uint64_t>(std::clamp<int64_t>(room, 0, kStreamChunkBytes))));
    size_t taken = 0;
    while (taken < budget) {
      const auto& part = result_->buffers[part_];
      const size_t take = std::min(budget - taken, part->size() - offset_);
      if (take > 0) ranges.push_back(PayloadRange{part->data() + offset_, take, part});
      taken += take;
      offset_ += take;
      if (offset_ == part->size()) {
        ++part_;
        offset_ = 0;
      }
    }
    remaining_ -= budget;
    response_ = MakeFrame(first ? &header : nullptr, ranges);
    if (remaining_ == 0) {
      finished_ = true;
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      StartWrite(&response_);
    }
  }

  void Finish(const absl::Status& status) {
    finished_ = true;
    grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>::Finish(ToGrpcStatus(status));
  }

  CollectiveEngine* const engine_;
  StreamSlots* const slots_;
  const absl::StatusOr<Caller> caller_;
  bool holds_slot_ = false;
  std::string member_slot_;  // set while this stream counts against its member
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  typename Traits::Header header_;
  CollectiveCall call_;
  v1::MemberRef member_;
  int64_t sequence_ = 0;
  bool header_seen_ = false;
  PayloadCursor payload_;  // what the header announced, and how much has arrived
  std::shared_ptr<Bytes> buffer_;
  std::atomic<bool> submitted_{false};
  std::atomic<bool> answered_{false};
  std::shared_ptr<const CollectiveResult> result_;
  uint64_t remaining_ = 0;
  size_t part_ = 0;
  size_t offset_ = 0;
  bool header_sent_ = false;
  bool finished_ = false;
};

// A member's session: one barrier or decision at a time on a long-lived stream. At most one
// operation is in flight: read a request, submit it, write its answer (or Finish with its
// error), then read the next.
class SessionReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionReactor(CollectiveEngine* engine, absl::StatusOr<Caller> caller)
      : engine_(engine), caller_(std::move(caller)) {
    if (!caller_.ok()) {
      Finish(ToGrpcStatus(caller_.status()));
      return;
    }
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // the client closed its session
    absl::StatusOr<v1::SessionRequest> parsed =
        ParseSmallRequest<v1::SessionRequest>(read_, "/dtrain.v1.Coordinator/Session");
    if (!parsed.ok()) return Finish(ToGrpcStatus(parsed.status()));
    request_ = std::move(*parsed);
    CollectiveCall call;
    switch (request_.call_case()) {
      case v1::SessionRequest::kBarrier:
        call.kind = CollectiveKind::kBarrier;
        FillContext(request_.barrier().context(), &call);
        call.barrier_name = request_.barrier().name();
        break;
      case v1::SessionRequest::kDecision:
        call.kind = CollectiveKind::kReduceBooleanDecision;
        FillContext(request_.decision().context(), &call);
        call.decision = request_.decision().decision();
        call.all = request_.decision().all();
        break;
      default:
        return Finish(ToGrpcStatus(absl::InvalidArgumentError(
            "session: the request carries neither a barrier nor a decision")));
    }
    const bool is_decision = call.kind == CollectiveKind::kReduceBooleanDecision;
    const char* what = is_decision ? "reduce_boolean_decision" : "barrier";
    if (absl::Status allowed = caller_->MayUseGroup(call.member.group(), what); !allowed.ok()) {
      return Finish(ToGrpcStatus(allowed));
    }
    {
      absl::MutexLock lock(&mu_);
      member_ = call.member;
      sequence_ = call.sequence;
      pending_ = true;
    }
    engine_->Submit(std::move(call),
                    [this, is_decision](const absl::Status& status,
                                        std::shared_ptr<const CollectiveResult> result) {
                      {
                        absl::MutexLock lock(&mu_);
                        pending_ = false;
                      }
                      if (!status.ok()) return Finish(ToGrpcStatus(status));
                      v1::SessionResponse response;
                      if (is_decision) {
                        response.mutable_decision()->set_decision(result->decision);
                      } else {
                        response.mutable_barrier();
                      }
                      grpc::Slice slice(response.SerializeAsString());
                      written_ = grpc::ByteBuffer(&slice, 1);
                      StartWrite(&written_);
                    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    StartRead(&read_);
  }

  void OnCancel() override {
    v1::MemberRef member;
    int64_t sequence = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!pending_) return;
      member = member_;
      sequence = sequence_;
    }
    engine_->Abandon(member, sequence);
  }

  void OnDone() override { delete this; }

 private:
  CollectiveEngine* const engine_;
  const absl::StatusOr<Caller> caller_;
  grpc::ByteBuffer read_;
  v1::SessionRequest request_;
  grpc::ByteBuffer written_;
  absl::Mutex mu_;
  v1::MemberRef member_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::Session(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(engine_, access_->Authenticate(*context));
}

CoordinatorService::CoordinatorService(GroupTable* groups, CollectiveEngine* engine,
                                       KeyValueStore* kv, const AccessControl* access)
    : groups_(groups),
      engine_(engine),
      kv_(kv),
      access_(access),
      slots_(std::make_unique<StreamSlots>()) {}

CoordinatorService::~CoordinatorService() = default;

absl::Status CoordinatorService::Authorize(const grpc::CallbackServerContext& context,
                                           const std::string* group, absl::string_view what) const {
  DTRAIN_ASSIGN_OR_RETURN(Caller caller, access_->Authenticate(context));
  return group == nullptr ? caller.MayAdminister(what) : caller.MayUseGroup(*group, what);
}

namespace {

// The member's own fields, then the group's shared member list unless the member asked to go
// without it: one RegisterResponse on the wire. The list is referenced, not copied, until gRPC
// has sent it.
grpc::ByteBuffer EncodeRegisterAnswer(const RegisterAnswer& answer, bool with_members) {
  const std::string own = answer.own.SerializeAsString();
  std::vector<grpc::Slice> slices;
  slices.reserve(2);  // so that the second emplace cannot throw and leak `held`
  slices.emplace_back(own);
  if (with_members && answer.members != nullptr && !answer.members->empty()) {
    auto* held = new std::shared_ptr<const std::string>(answer.members);
    slices.emplace_back(
        const_cast<char*>((*held)->data()), (*held)->size(),
        [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }, held);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response) {
  absl::StatusOr<v1::RegisterRequest> request =
      ParseSmallRequest<v1::RegisterRequest>(*request_bytes, "/dtrain.v1.Coordinator/Register");
  if (!request.ok()) return FinishNow(context, request.status());
  if (absl::Status s = Authorize(*context, &request->group(), "register"); !s.ok()) {
    return FinishNow(context, s);
  }
  auto* reactor = new CancellableReactor(
      [groups = groups_, group = request->group(), incarnation = request->incarnation()] {
        groups->CancelRegistration(group, incarnation);
      });
  groups_->Register(*request, [reactor, response, with_members = !request->omit_members()](
                                  absl::StatusOr<RegisterAnswer> r) {
    if (r.ok()) {
      grpc::ByteBuffer encoded = EncodeRegisterAnswer(*r, with_members);
      response->Swap(&encoded);
    }
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  if (absl::Status s = Authorize(*context, &request->member().group(), "heartbeat"); !s.ok()) {
    return FinishNow(context, s);
  }
  return FinishNow(context, groups_->Heartbeat(request->member()));
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* context,
                                                    const v1::LeaveRequest* request,
                                                    v1::LeaveResponse* response) {
  if (absl::Status s = Authorize(*context, &request->member().group(), "leave"); !s.ok()) {
    return FinishNow(context, s);
  }
  return FinishNow(context, groups_->Leave(request->member()));
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitUnary(
    CollectiveCall call, std::function<void(const CollectiveResult&)> fill) {
  auto* reactor =
      new CancellableReactor([engine = engine_, member = call.member, sequence = call.sequence] {
        engine->Abandon(member, sequence);
      });
  engine_->Submit(std::move(call),
                  [reactor, fill = std::move(fill)](
                      const absl::Status& status, std::shared_ptr<const CollectiveResult> result) {
                    if (status.ok() && fill) fill(*result);
                    reactor->Finish(ToGrpcStatus(status));
                  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Barrier(grpc::CallbackServerContext* context,
                                                      const v1::BarrierRequest* request,
                                                      v1::BarrierResponse* response) {
  if (absl::Status s = Authorize(*context, &request->context().member().group(), "barrier");
      !s.ok()) {
    return FinishNow(context, s);
  }
  CollectiveCall call;
  call.kind = CollectiveKind::kBarrier;
  FillContext(request->context(), &call);
  call.barrier_name = request->name();
  return SubmitUnary(std::move(call), nullptr);
}

grpc::ServerUnaryReactor* CoordinatorService::ReduceBooleanDecision(
    grpc::CallbackServerContext* context, const v1::ReduceBooleanDecisionRequest* request,
    v1::ReduceBooleanDecisionResponse* response) {
  if (absl::Status s =
          Authorize(*context, &request->context().member().group(), "reduce_boolean_decision");
      !s.ok()) {
    return FinishNow(context, s);
  }
  CollectiveCall call;
  call.kind = CollectiveKind::kReduceBooleanDecision;
  FillContext(request->context(), &call);
  call.decision = request->decision();
  call.all = request->all();
  return SubmitUnary(std::move(call), [response](const CollectiveResult& result) {
    response->set_decision(result.decision);
  });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::Broadcast(
    grpc::CallbackServerContext* context) {
  return new TensorCollectiveReactor<BroadcastTraits>(engine_, slots_.get(),
                                                      access_->Authenticate(*context));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::AllGather(
    grpc::CallbackServerContext* context) {
  return new TensorCollectiveReactor<AllGatherTraits>(engine_, slots_.get(),
                                                      access_->Authenticate(*context));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::Reduce(
    grpc::CallbackServerContext* context) {
  return new TensorCollectiveReactor<ReduceTraits>(engine_, slots_.get(),
                                                   access_->Authenticate(*context));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CoordinatorService::AllReduce(
    grpc::CallbackServerContext* context) {
  return new TensorCollectiveReactor<AllReduceTraits>(engine_, slots_.get(),
                                                      access_->Authenticate(*context));
}

grpc::ServerUnaryReactor* CoordinatorService::KeyValueSet(grpc::CallbackServerContext* context,
                                                          const v1::KeyValueSetRequest* request,
                                                          v1::KeyValueSetResponse* response) {
  if (absl::Status s = Authorize(*context, &request->scope(), "key-value access"); !s.ok()) {
    return FinishNow(context, s);
  }
  return FinishNow(context, kv_->Set(request->scope(), request->key(), request->value()));
}

grpc::ServerUnaryReactor* CoordinatorService::KeyValueGet(grpc::CallbackServerContext* context,
                                                          const v1::KeyValueGetRequest* request,
                                                          v1::KeyValueGetResponse* response) {
  if (absl::Status s = Authorize(*context, &request->scope(), "key-value access"); !s.ok()) {
    return FinishNow(context, s);
  }
  // Nothing to undo on cancel: the waiter times out on its own and Finish after a cancel is
  // harmless.
  auto* reactor = new CancellableReactor(nullptr);
  kv_->Get(request->scope(), request->key(), absl::Milliseconds(request->wait_timeout_ms()),
           [reactor, response](absl::StatusOr<std::string> value) {
             if (value.ok()) response->set_value(std::move(*value));
             reactor->Finish(ToGrpcStatus(value.status()));
           });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KeyValueAdd(grpc::CallbackServerContext* context,
                                                          const v1::KeyValueAddRequest* request,
                                                          v1::KeyValueAddResponse* response) {
  if (absl::Status s = Authorize(*context, &request->scope(), "key-value access"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::StatusOr<int64_t> value = kv_->Add(request->scope(), request->key(), request->delta());
  if (value.ok()) response->set_value(*value);
  return FinishNow(context, value.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KeyValueCompareAndSet(
    grpc::CallbackServerContext* context, const v1::KeyValueCompareAndSetRequest* request,
    v1::KeyValueCompareAndSetResponse* response) {
  if (absl::Status s = Authorize(*context, &request->scope(), "key-value access"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::StatusOr<KeyValueStore::CasResult> result =
      kv_->CompareAndSet(request->scope(), request->key(), request->expected(), request->desired());
  if (result.ok()) {
    response->set_swapped(result->swapped);
    response->set_present(result->present);
    response->set_value(std::move(result->value));
  }
  return FinishNow(context, result.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KeyValueDelete(
    grpc::CallbackServerContext* context, const v1::KeyValueDeleteRequest* request,
    v1::KeyValueDeleteResponse* response) {
  if (absl::Status s = Authorize(*context, &request->scope(), "key-value access"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::StatusOr<bool> deleted = kv_->Delete(request->scope(), request->key());
  if (deleted.ok()) response->set_deleted(*deleted);
  return FinishNow(context, deleted.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KeyValueList(grpc::CallbackServerContext* context,
                                                           const v1::KeyValueListRequest* request,
                                                           v1::KeyValueListResponse* response) {
  if (absl::Status s = Authorize(*context, &request->scope(), "key-value access"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::StatusOr<KeyPage> page =
      KeyPage::Parse(request->page_size(), request->page_token(), kStreamChunkBytes);
  if (!page.ok()) return FinishNow(context, page.status());
  auto entries = kv_->List(request->scope(), request->prefix(), &*page);
  if (entries.ok()) {
    for (auto& [key, value] : *entries) {
      v1::KeyValueEntry* e = response->add_entries();
      e->set_key(key);
      e->set_value(std::move(value));
    }
    response->set_next_page_token(page->next_page_token());
  }
  return FinishNow(context, entries.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListGroups(grpc::CallbackServerContext* context,
                                                         const v1::ListGroupsRequest* request,
                                                         v1::ListGroupsResponse* response) {
  if (absl::Status s = Authorize(*context, nullptr, "ListGroups"); !s.ok()) {
    return FinishNow(context, s);
  }
  absl::StatusOr<KeyPage> page =
      KeyPage::Parse(request->page_size(), request->page_token(), kStreamChunkBytes);
  if (!page.ok()) return FinishNow(context, page.status());
  for (v1::GroupInfo& info : groups_->List(&*page)) *response->add_groups() = std::move(info);
  response->set_next_page_token(page->next_page_token());
  return FinishNow(context, absl::OkStatus());
}

}  // namespace dtrain

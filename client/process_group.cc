#include "client/process_group.h"

#include <unistd.h>

#include <chrono>
#include <random>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/tensor_stream.h"
#include "common/bearer_token.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/streaming.h"

namespace dtrain {
namespace {

// The server answers a collective's own deadline; the transport deadline only catches a
// coordinator that stopped answering, so it is later by this much plus transfer time.
constexpr absl::Duration kTransportGrace = absl::Seconds(10);
constexpr double kSlowestBytesPerSecond = 50e6;

// A call that did not get through or was answered late: the coordinator may be busy or the
// network briefly down, and the next heartbeat may well be answered.
bool IsTransportTrouble(absl::StatusCode code) {
  return code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kResourceExhausted;
}

uint64_t RandomIncarnation() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(getpid()) ^
                      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

absl::StatusOr<std::vector<HostTensor>> Split(const std::vector<v1::TensorMeta>& parts,
                                              std::string& bytes) {
  std::vector<HostTensor> out;
  if (parts.size() == 1) {  // the common case: hand the buffer over instead of copying it
    DTRAIN_ASSIGN_OR_RETURN(int64_t size, ValidateMeta(parts[0]));
    if (static_cast<size_t>(size) != bytes.size()) {
      return absl::InternalError("the coordinator's result stream does not match its header");
    }
    HostTensor t;
    t.dtype = parts[0].dtype();
    t.shape = ShapeOf(parts[0]);
    t.data = std::move(bytes);
    out.push_back(std::move(t));
    return out;
  }
  out.reserve(parts.size());
  size_t offset = 0;
  for (const v1::TensorMeta& meta : parts) {
    DTRAIN_ASSIGN_OR_RETURN(int64_t size, ValidateMeta(meta));
    if (offset + static_cast<size_t>(size) > bytes.size()) {
      return absl::InternalError("the coordinator's result stream is shorter than its header");
    }
    HostTensor t;
    t.dtype = meta.dtype();
    t.shape = ShapeOf(meta);
    t.data.assign(bytes, offset, static_cast<size_t>(size));
    offset += static_cast<size_t>(size);
    out.push_back(std::move(t));
  }
  if (offset != bytes.size()) {
    return absl::InternalError("the coordinator's result stream is longer than its header");
  }
  return out;
}

std::string TokenOf(const ProcessGroupOptions& options) {
  return options.token.empty() && !options.only_given_token ? ClientToken() : options.token;
}

}  // namespace

ProcessGroup::ProcessGroup(const std::string& address, ProcessGroupOptions options)
    : address_(address),
      channel_(ConnectToCoordinator(address, TokenOf(options))),
      stub_(v1::Coordinator::NewStub(channel_)),
      generic_(std::make_unique<grpc::GenericStub>(channel_)),
      control_(v1::Coordinator::NewStub(ConnectToCoordinator(address, TokenOf(options)))),
      options_(std::move(options)) {
  options_.token = TokenOf(options_);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Join(const std::string& address,
                                                                 ProcessGroupOptions options) {
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(address, std::move(options)));
  ProcessGroupOptions& o = pg->options_;
  if (o.host.empty()) o.host = HostName();
  if (o.incarnation == 0) o.incarnation = RandomIncarnation();

  v1::RegisterRequest request;
  request.set_group(o.group);
  request.set_host(o.host);
  request.set_local_devices(o.local_devices);
  request.set_order_key(o.order_key);
  request.set_name(o.name);
  request.set_incarnation(o.incarnation);
  request.set_world_size(o.world_size);
  request.set_min_world_size(o.min_world_size);
  request.set_settle_timeout_ms(absl::ToInt64Milliseconds(o.settle_timeout));
  request.set_generation(o.generation);
  request.set_timeout_ms(absl::ToInt64Milliseconds(o.register_timeout));
  request.set_collective_timeout_ms(absl::ToInt64Milliseconds(o.collective_timeout));
  request.set_omit_members(!o.member_list);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + o.register_timeout + kTransportGrace));
  // A worker may start before its coordinator, or hit a transient connect failure: joining
  // waits for the connection (bounded by the deadline) instead of failing at once. Later calls
  // do not, so that a coordinator that went away is reported at once.
  context.set_wait_for_ready(true);
  CallCanceller::Registration cancellable(o.cancel, &context);
  grpc::Status status = pg->stub_->Register(&context, request, &pg->assignment_);
  if (!status.ok()) return FromGrpcStatus(status);

  pg->store_ = std::make_unique<KeyValueClient>(pg->channel_, o.group);
  if (o.send_heartbeats) {
    pg->heartbeat_thread_ = std::thread([p = pg.get()] { p->HeartbeatLoop(); });
  }
  return pg;
}

ProcessGroup::~ProcessGroup() {
  Leave().IgnoreError();
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

void ProcessGroup::HeartbeatLoop() {
  const absl::Duration interval =
      absl::Milliseconds(std::max<int64_t>(assignment_.heartbeat_interval_ms(), 10));
  // A heartbeat answered late or lost on the way is not a verdict: the coordinator declares a
  // member dead only after heartbeat_timeout without one, and every collective that consults
  // health() would otherwise fail at the first late answer on a busy machine. The coordinator
  // counts as lost after as long without any answer.
  const absl::Duration patience =
      std::max(absl::Milliseconds(assignment_.heartbeat_timeout_ms()), interval * 2);
  // A coordinator that answers every heartbeat slowly is alive: each call waits up to a quarter
  // of the patience, but never past the moment the verdict is due, so the verdict is on time.
  const absl::Duration per_call = std::max(interval * 2, patience / 4);
  // Silence is measured on the monotonic clock: a wall-clock step must not make a verdict.
  auto last_answer = std::chrono::steady_clock::now();
  auto silent = [&] { return absl::FromChrono(std::chrono::steady_clock::now() - last_answer); };
  v1::HeartbeatRequest request;
  *request.mutable_member() = assignment_.member();
  while (!stop_heartbeats_.WaitForNotificationWithTimeout(interval)) {
    grpc::ClientContext context;
    const absl::Duration left = patience - silent();
    context.set_deadline(absl::ToChronoTime(
        absl::Now() + (left > absl::Milliseconds(1) ? std::min(per_call, left) : per_call)));
    v1::HeartbeatResponse response;
    absl::Status status = FromGrpcStatus(control_->Heartbeat(&context, request, &response));
    if (!IsTransportTrouble(status.code())) {
      // Any answer, a refusal included, shows the coordinator is there.
      last_answer = std::chrono::steady_clock::now();
    } else {
      const absl::Duration quiet = silent();
      if (quiet < patience) continue;
      status = absl::UnavailableError(absl::StrCat(
          "the coordinator at ", address_, " has answered no heartbeat for ",
          absl::FormatDuration(absl::Trunc(quiet, absl::Milliseconds(1))), " (heartbeat timeout ",
          absl::FormatDuration(patience), "; the last call: ", status.message(),
          "): it is down, unreachable or overloaded"));
    }
    absl::MutexLock lock(&health_mu_);
    health_ = status;
    // A failed or finished group never recovers; stop talking to it.
    if (status.code() == absl::StatusCode::kAborted ||
        status.code() == absl::StatusCode::kFailedPrecondition ||
        status.code() == absl::StatusCode::kNotFound) {
      return;
    }
  }
}

absl::Status ProcessGroup::health() const {
  absl::MutexLock lock(&health_mu_);
  return health_;
}

absl::Status ProcessGroup::Leave() {
  absl::MutexLock lock(&call_mu_);
  if (left_) return absl::OkStatus();
  left_ = true;
  session_.reset();
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kTransportGrace));
  v1::LeaveRequest request;
  *request.mutable_member() = assignment_.member();
  v1::LeaveResponse response;
  return FromGrpcStatus(stub_->Leave(&context, request, &response));
}

absl::Time ProcessGroup::NextContext(const CallOptions& options, int64_t payload_bytes,
                                     v1::CollectiveContext* context) {
  *context->mutable_member() = assignment_.member();
  context->set_sequence(next_sequence_++);
  context->set_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  const absl::Duration timeout = options.timeout > absl::ZeroDuration()
                                     ? options.timeout
                                     : absl::Milliseconds(assignment_.collective_timeout_ms());
  return absl::Now() + timeout + kTransportGrace +
         absl::Seconds(static_cast<double>(payload_bytes) / kSlowestBytesPerSecond);
}

absl::Status ProcessGroup::Barrier(const std::string& name, CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  v1::BarrierRequest request;
  const absl::Time deadline = NextContext(options, 0, request.mutable_context());
  request.set_name(name);
  v1::SessionRequest call;
  *call.mutable_barrier() = std::move(request);
  return SessionCall(call, deadline).status();
}

absl::StatusOr<v1::SessionResponse> ProcessGroup::SessionCall(const v1::SessionRequest& request,
                                                              absl::Time deadline) {
  DTRAIN_RETURN_IF_ERROR(CheckInStep());
  if (session_ == nullptr || !session_->alive()) session_ = std::make_unique<Session>(stub_.get());
  absl::StatusOr<v1::SessionResponse> response = session_->Call(request, deadline, &interrupt_);
  if (!response.ok()) {
    return Interrupted(Settle(response.status()),
                       request.has_barrier() ? "barrier" : "reduce_boolean_decision");
  }
  return response;
}

absl::StatusOr<TensorStreamResult> ProcessGroup::Stream(const std::string& method,
                                                        const google::protobuf::MessageLite& header,
                                                        const std::string* payload,
                                                        absl::Time deadline, std::string* into) {
  DTRAIN_RETURN_IF_ERROR(CheckInStep());
  absl::StatusOr<TensorStreamResult> result =
      RunTensorStream(generic_.get(), absl::StrCat("/dtrain.v1.Coordinator/", method), header,
                      payload, deadline, into, &interrupt_);
  if (!result.ok()) {
    return Interrupted(Settle(result.status()), method == "AllGather"   ? "all_gather"
                                                : method == "Broadcast" ? "broadcast"
                                                                        : "reduce");
  }
  return result;
}

absl::Status ProcessGroup::Interrupted(absl::Status status, absl::string_view what) {
  if (!CallCanceller::IsInterruption(status)) return status;
  absl::Status cut(status.code(), absl::StrCat(what, " on rank ", rank(), ": ", status.message()));
  if (cut_short_.ok()) cut_short_ = cut;
  return cut;
}

absl::Status ProcessGroup::CheckInStep() const {
  if (cut_short_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this rank's collectives are out of step with its group since one was cut "
                   "short (",
                   cut_short_.message(), "); the job must re-form its group"));
}

absl::Status ProcessGroup::Settle(absl::Status status) {
  // The coordinator checks a call's input before numbering it, so a rejected call never took
  // its sequence number: give it back, or every later call of this rank would be out of step.
  if (status.code() == absl::StatusCode::kInvalidArgument) --next_sequence_;
  return status;
}

absl::StatusOr<bool> ProcessGroup::ReduceBooleanDecision(bool decision, bool all,
                                                         CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  v1::ReduceBooleanDecisionRequest request;
  const absl::Time deadline = NextContext(options, 0, request.mutable_context());
  request.set_decision(decision);
  request.set_all(all);
  v1::SessionRequest call;
  *call.mutable_decision() = std::move(request);
  DTRAIN_ASSIGN_OR_RETURN(v1::SessionResponse response, SessionCall(call, deadline));
  return response.decision().decision();
}

absl::StatusOr<HostTensor> ProcessGroup::Broadcast(int src, const HostTensor* tensor,
                                                   CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  v1::BroadcastHeader header;
  const absl::Time deadline = NextContext(
      options, tensor ? static_cast<int64_t>(tensor->data.size()) : 0, header.mutable_context());
  header.set_src(src);
  header.set_kind(v1::PAYLOAD_KIND_TENSOR);
  if (tensor != nullptr) *header.mutable_meta() = MetaOf(*tensor);
  DTRAIN_ASSIGN_OR_RETURN(TensorStreamResult result,
                          Stream("Broadcast", header, tensor ? &tensor->data : nullptr, deadline));
  DTRAIN_ASSIGN_OR_RETURN(std::vector<HostTensor> parts, Split(result.parts, result.bytes));
  if (parts.size() != 1) return absl::InternalError("broadcast answered with no tensor");
  return std::move(parts[0]);
}

absl::StatusOr<std::string> ProcessGroup::BroadcastBytes(int src, const std::string* bytes,
                                                         CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  v1::BroadcastHeader header;
  const absl::Time deadline = NextContext(options, bytes ? static_cast<int64_t>(bytes->size()) : 0,
                                          header.mutable_context());
  header.set_src(src);
  header.set_kind(v1::PAYLOAD_KIND_BYTES);
  if (bytes != nullptr) {
    header.mutable_meta()->set_dtype(v1::DTYPE_UINT8);
    header.mutable_meta()->add_shape(static_cast<int64_t>(bytes->size()));
  }
  DTRAIN_ASSIGN_OR_RETURN(TensorStreamResult result, Stream("Broadcast", header, bytes, deadline));
  return std::move(result.bytes);
}

absl::StatusOr<std::vector<HostTensor>> ProcessGroup::AllGather(const HostTensor& tensor,
                                                                CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  v1::AllGatherHeader header;
  const absl::Time deadline = NextContext(
      options, static_cast<int64_t>(tensor.data.size()) * world_size(), header.mutable_context());
  *header.mutable_meta() = MetaOf(tensor);
  DTRAIN_ASSIGN_OR_RETURN(TensorStreamResult result,
                          Stream("AllGather", header, &tensor.data, deadline));
  return Split(result.parts, result.bytes);
}

absl::StatusOr<HostTensor> ProcessGroup::AllReduce(const HostTensor& tensor, v1::ReduceOp op,
                                                   CallOptions options) {
  HostTensor out;
  out.dtype = tensor.dtype;
  out.shape = tensor.shape;
  out.data.resize(tensor.data.size());
  DTRAIN_RETURN_IF_ERROR(AllReduceInto(tensor, op, out.data.data(), options));
  return out;
}

absl::Status ProcessGroup::AllReduceInPlace(HostTensor* tensor, v1::ReduceOp op,
                                            CallOptions options) {
  // The payload is sent from the buffer the result lands in: the coordinator answers a
  // segment only after every rank's input for it has fully arrived, so the two never overlap.
  return AllReduceInto(*tensor, op, tensor->data.data(), options);
}

absl::Status ProcessGroup::AllReduceInto(const HostTensor& tensor, v1::ReduceOp op, char* out,
                                         CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  DTRAIN_RETURN_IF_ERROR(CheckInStep());
  const v1::TensorMeta meta = MetaOf(tensor);
  const absl::StatusOr<int64_t> element = DTypeSize(tensor.dtype);
  const size_t bytes = tensor.data.size();
  // Large tensors go as segments in flight together, so that the coordinator reduces and
  // returns one segment while the next arrives. Segment boundaries fall on elements.
  // At least kSegmentBytes each, at most kMaxSegmentsInFlight of them.
  size_t segment_bytes = bytes;
  if (element.ok() && bytes > static_cast<size_t>(kSegmentBytes)) {
    const size_t wanted =
        std::max<size_t>(kSegmentBytes, (bytes + kMaxSegmentsInFlight - 1) / kMaxSegmentsInFlight);
    segment_bytes = (wanted + *element - 1) / *element * *element;
  }
  const size_t segments = bytes == 0 ? 1 : (bytes + segment_bytes - 1) / segment_bytes;
  std::vector<v1::AllReduceHeader> headers(segments);
  std::vector<TensorStreamSpec> specs(segments);
  absl::Time deadline;
  for (size_t i = 0; i < segments; ++i) {
    v1::AllReduceHeader& header = headers[i];
    const size_t offset = i * segment_bytes;
    const size_t size = std::min(segment_bytes, bytes - std::min(bytes, offset));
    deadline = NextContext(options, static_cast<int64_t>(bytes) * 2, header.mutable_context());
    header.set_op(op);
    if (segments == 1) {
      *header.mutable_meta() = meta;
    } else {
      header.mutable_meta()->set_dtype(tensor.dtype);
      header.mutable_meta()->add_shape(static_cast<int64_t>(size / *element));
      header.mutable_segment()->set_index(static_cast<int32_t>(i));
      header.mutable_segment()->set_count(static_cast<int32_t>(segments));
      *header.mutable_segment()->mutable_whole() = meta;
    }
    TensorStreamSpec& spec = specs[i];
    spec.method = "/dtrain.v1.Coordinator/AllReduce";
    spec.header = &header;
    spec.payload = tensor.data.data() + offset;
    spec.payload_size = size;
    spec.into = out + offset;
    spec.into_size = size;
  }
  absl::Status first_error;
  absl::Status cut;  // a segment cut short by Interrupt, which puts the rank out of step
  int refused = 0;
  for (auto& result : RunTensorStreams(generic_.get(), specs, deadline, &interrupt_)) {
    if (result.ok()) continue;
    if (result.status().code() == absl::StatusCode::kInvalidArgument) ++refused;
    if (first_error.ok()) first_error = result.status();
    if (cut.ok() && CallCanceller::IsInterruption(result.status())) cut = result.status();
  }
  // Refused segments were not counted by the coordinator (see Settle).
  next_sequence_ -= refused;
  return Interrupted(cut.ok() ? first_error : cut, "all_reduce");
}

absl::StatusOr<std::optional<HostTensor>> ProcessGroup::Reduce(const HostTensor& tensor,
                                                               v1::ReduceOp op, int dst,
                                                               CallOptions options) {
  absl::MutexLock lock(&call_mu_);
  v1::ReduceHeader header;
  const absl::Time deadline =
      NextContext(options, static_cast<int64_t>(tensor.data.size()) * 2, header.mutable_context());
  header.set_op(op);
  header.set_dst(dst);
  *header.mutable_meta() = MetaOf(tensor);
  DTRAIN_ASSIGN_OR_RETURN(TensorStreamResult result,
                          Stream("Reduce", header, &tensor.data, deadline));
  DTRAIN_ASSIGN_OR_RETURN(std::vector<HostTensor> parts, Split(result.parts, result.bytes));
  if (parts.empty()) return std::optional<HostTensor>();
  return std::optional<HostTensor>(std::move(parts[0]));
}

absl::StatusOr<HostTensor> ProcessGroup::Stack(const std::vector<HostTensor>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("stack of no tensors");
  HostTensor out;
  out.dtype = parts[0].dtype;
  out.shape.push_back(static_cast<int64_t>(parts.size()));
  out.shape.insert(out.shape.end(), parts[0].shape.begin(), parts[0].shape.end());
  for (size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].shape != parts[0].shape || parts[r].dtype != parts[0].dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot stack: part ", r, " is ", DescribeMeta(MetaOf(parts[r])), " but part 0 is ",
          DescribeMeta(MetaOf(parts[0])), "; use Concat for uneven first dimensions"));
    }
    out.data += parts[r].data;
  }
  return out;
}

absl::StatusOr<HostTensor> ProcessGroup::Concat(const std::vector<HostTensor>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("concat of no tensors");
  if (parts[0].shape.empty()) return absl::InvalidArgumentError("cannot concat scalars");
  HostTensor out;
  out.dtype = parts[0].dtype;
  out.shape = parts[0].shape;
  out.shape[0] = 0;
  for (size_t r = 0; r < parts.size(); ++r) {
    const auto& s = parts[r].shape;
    if (parts[r].dtype != out.dtype || s.size() != out.shape.size() ||
        !std::equal(s.begin() + 1, s.end(), out.shape.begin() + 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot concat: part ", r, " is ", DescribeMeta(MetaOf(parts[r])),
                       ", which differs from part 0 beyond dimension 0"));
    }
    out.shape[0] += s[0];
    out.data += parts[r].data;
  }
  return out;
}

}  // namespace dtrain

#include "worker/collectives/gloo_collective_backend.h"

#include <torch/types.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <gloo/context.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "common/status_macros.h"
#include "worker/collectives/coordinator_store.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

absl::StatusOr<c10d::ReduceOp> ToGloo(v1::ReduceOp op) {
  switch (op) {
    case v1::REDUCE_OP_SUM:
    case v1::REDUCE_OP_MEAN:  // summed, then divided: Gloo has no average
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case v1::REDUCE_OP_MAX:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case v1::REDUCE_OP_MIN:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case v1::REDUCE_OP_PRODUCT:
      return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int>(op)));
  }
}

// Mean from a sum, as the coordinator computes it: floating types divide, integers divide
// rounding toward zero, booleans have no mean.
absl::Status DivideForMean(torch::Tensor& tensor, int world) {
  if (tensor.scalar_type() == torch::kBool) {
    return absl::InvalidArgumentError("the mean of booleans is undefined; use sum, max or min");
  }
  torch::NoGradGuard no_grad;
  if (tensor.is_floating_point()) {
    tensor.div_(world);
  } else {
    tensor.copy_(tensor.div(world, "trunc"));
  }
  return absl::OkStatus();
}

// Integers narrower than 64 bits are averaged in int64 (summed, then divided), as the
// coordinator's plane does: their sum may overflow where their mean does not.
bool WidenedForMean(const torch::Tensor& tensor, v1::ReduceOp op) {
  const torch::ScalarType t = tensor.scalar_type();
  return op == v1::REDUCE_OP_MEAN && t != torch::kBool && t != torch::kInt64 &&
         c10::isIntegralType(t, /*includeBool=*/false);
}

// The address this host reaches `coordinator` ("host:port", "[v6]:port", "ipv4:" / "dns:///"
// prefixes allowed) from: the interface peers on the coordinator's network can reach, which
// the host name (Gloo's default) often is not: it may resolve to 127.0.1.1 or to nothing.
absl::StatusOr<std::string> LocalAddressToward(std::string coordinator) {
  for (const char* prefix : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(coordinator, prefix)) coordinator = coordinator.substr(strlen(prefix));
  }
  const size_t colon = coordinator.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("no port in " + coordinator);
  std::string host = coordinator.substr(0, colon);
  const std::string port = coordinator.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(e)));
  }
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // A datagram socket's connect sends nothing: it only picks the route and source address.
    sockaddr_storage mine{};
    socklen_t length = sizeof(mine);
    char text[INET6_ADDRSTRLEN] = {0};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &length) == 0) {
      const void* raw =
          mine.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&mine)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&mine)->sin_addr);
      if (inet_ntop(mine.ss_family, raw, text, sizeof(text)) != nullptr) local = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (local.empty()) return absl::UnavailableError("no route to " + coordinator);
  return local;
}

// Gloo's device: GLOO_SOCKET_IFNAME's interface when set (as torch.distributed honours it),
// else the address this host reaches the coordinator from, else Gloo's default (host name).
std::shared_ptr<::gloo::transport::Device> GlooDevice(const std::string& coordinator) {
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (interface != nullptr && *interface != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  absl::StatusOr<std::string> local = LocalAddressToward(coordinator);
  if (local.ok()) return c10d::ProcessGroupGloo::createDeviceForHostname(*local);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// ProcessGroupGloo takes one timeout for connecting and for every operation; its contexts are
// protected, so a subclass sets the operations' timeout after connecting with a shorter one.
// Only the contexts' timeout changes: the transport's pairs keep the connect one (a fifth of
// the budget, see Make). Every operation dtrain issues (all_reduce, all_gather, barrier,
// broadcast, reduce) reads the context's; a point-to-point send or recv, if one is ever added,
// would wait with the pairs' and must be given its timeout explicitly.
class ConnectedProcessGroupGloo : public c10d::ProcessGroupGloo {
 public:
  using c10d::ProcessGroupGloo::ProcessGroupGloo;
  void SetOperationTimeout(std::chrono::milliseconds timeout) {
    for (const auto& context : contexts_) context->setTimeout(timeout);
  }
};

}  // namespace

template <typename F>
absl::Status GlooCollectiveBackend::Guard(const std::string& what, F&& body, bool await_verdict) {
  try {
    body();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    // A peer that died closed its connections at once; the coordinator names it once its
    // heartbeats stop (or its own calls dropped).
    const absl::Time deadline =
        await_verdict
            ? absl::Now() + absl::Milliseconds(group_->assignment().heartbeat_timeout_ms()) +
                  absl::Seconds(2)
            : absl::Now();
    absl::Status health = group_->health();
    while (health.ok() && absl::Now() < deadline && interruption().ok()) {
      absl::SleepFor(absl::Milliseconds(50));
      health = group_->health();
    }
    if (!health.ok()) {
      return absl::Status(health.code(), absl::StrCat("gloo ", what, ": ", health.message()));
    }
    const std::string message = dynamic_cast<const c10::Error*>(&e) != nullptr
                                    ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                    : e.what();
    return absl::AbortedError(
        absl::StrCat("gloo ", what, " failed on rank ", rank(), ": ", message));
  }
}

template <typename F>
absl::Status GlooCollectiveBackend::Run(const std::string& what, F&& start) {
  if (!broken_.ok()) return broken_;
  absl::Status stopped;
  absl::Status status = Guard(what, [&] {
    c10::intrusive_ptr<c10d::Work> work = start();
    // Waited for in slices rather than for Gloo's operation timeout (the collective timeout,
    // minutes): a cancelled step or a member the coordinator declared gone ends the wait now.
    absl::Time next_health = absl::Now() + absl::Milliseconds(50);
    while (true) {
      try {
        work->wait(std::chrono::milliseconds(20));
        return;
      } catch (const c10::Error&) {
        // The slice ran out, or the operation failed; it may also have completed since the
        // slice ran out: wait() again gives its own outcome, at once.
        if (work->isCompleted()) {
          work->wait();
          return;
        }
      }
      stopped = interruption();
      if (stopped.ok() && absl::Now() >= next_health) {
        next_health = absl::Now() + absl::Milliseconds(50);
        stopped = group_->health();
      }
      if (!stopped.ok()) return;
    }
  });
  if (!stopped.ok()) {
    return Abandon(absl::Status(
        stopped.code(), absl::StrCat("gloo ", what, " on rank ", rank(), ": ", stopped.message())));
  }
  if (!status.ok()) broken_ = status;
  return status;
}

absl::Status GlooCollectiveBackend::Abandon(absl::Status why) {
  broken_ = why;
  // Gloo's worker thread stays blocked in the operation until its peers close their
  // connections or the operation times out; destroying the process group joins that thread,
  // so it is destroyed off this thread and the step's teardown does not wait for it.
  std::thread([gloo = std::move(gloo_)]() mutable { gloo.reset(); }).detach();
  return why;
}

absl::StatusOr<std::unique_ptr<GlooCollectiveBackend>> GlooCollectiveBackend::Make(
    const std::string& coordinator, std::unique_ptr<ProcessGroup> group, absl::Duration timeout,
    const GlooConnectOptions& connect) {
  ProcessGroup* borrowed = group.get();
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<GlooCollectiveBackend> backend,
                          Make(coordinator, borrowed, timeout, connect));
  backend->owned_ = std::move(group);
  return backend;
}

absl::StatusOr<std::unique_ptr<GlooCollectiveBackend>> GlooCollectiveBackend::Make(
    const std::string& coordinator, ProcessGroup* group, absl::Duration timeout,
    const GlooConnectOptions& connect) {
  // Zero would be c10d's "no timeout" in the store while Gloo's pairs gave up at once.
  if (timeout <= absl::ZeroDuration() || connect.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo needs positive timeouts; got ", absl::FormatDuration(timeout), " for operations and ",
        absl::FormatDuration(connect.timeout), " for connecting"));
  }
  std::unique_ptr<GlooCollectiveBackend> backend(new GlooCollectiveBackend());
  backend->group_ = group;
  ProcessGroup& g = *backend->group_;
  const auto chrono_timeout = absl::ToChronoMilliseconds(timeout);
  const auto chrono_connect = absl::ToChronoMilliseconds(std::min(timeout, connect.timeout));
  // Gloo's pairs wait five times the context's timeout for their first connection
  // (gloo/transport/tcp/pair.h, Pair::waitUntil), so the context gets a fifth of the budget
  // for connecting, and the operations' timeout once connected.
  const auto gloo_connect = std::max(std::chrono::milliseconds(1), chrono_connect / 5);
  // Gloo's rendezvous keys are per context, not only per group generation: a second context of
  // the same generation (a plane made again) would otherwise read the first one's addresses and
  // time out connecting to pairs that are gone. Rank 0 names the context and the others learn
  // the name, so ranks agree even if their histories of contexts differ.
  static std::atomic<uint64_t> contexts_made{0};
  const std::string named =
      g.rank() == 0 ? absl::StrCat(g.incarnation(), ".", ++contexts_made) : std::string();
  // Within the connect budget, as the rendezvous after it: a rank that never comes is named
  // by the coordinator's error.
  CollectiveOptions within;
  within.timeout = absl::FromChrono(chrono_connect);
  absl::StatusOr<std::string> context =
      g.BroadcastBytes(0, g.rank() == 0 ? &named : nullptr, within);
  if (!context.ok()) {
    return absl::Status(context.status().code(), absl::StrCat("gloo rendezvous on rank ", g.rank(),
                                                              ": agreeing on the context's name: ",
                                                              context.status().message()));
  }
  absl::Status connected = backend->Guard(
      "rendezvous",
      [&] {
        auto kv = std::make_shared<KeyValueClient>(ConnectToCoordinator(coordinator, g.token()),
                                                   g.assignment().member().group());
        // Keys are per generation and context: a re-formed group never meets its
        // predecessor's keys, nor those of a context made before it in the same generation.
        auto store = c10::make_intrusive<c10d::PrefixStore>(
            absl::StrCat("gloo/", g.generation(), "/", *context),
            c10::make_intrusive<CoordinatorStore>(kv, chrono_connect, chrono_connect));
        auto options = c10d::ProcessGroupGloo::Options::create(gloo_connect);
        options->devices.push_back(GlooDevice(coordinator));
        options->threads = 2;
        auto gloo = c10::make_intrusive<ConnectedProcessGroupGloo>(store, g.rank(), g.world_size(),
                                                                   options);
        gloo->SetOperationTimeout(chrono_timeout);
        backend->gloo_ = gloo;
      },
      /*await_verdict=*/!connect.caller_agrees_on_failure);
  if (!connected.ok() && !connect.caller_agrees_on_failure &&
      absl::StrContains(connected.message(), "Connect timeout")) {
    return absl::Status(
        connected.code(),
        absl::StrCat(connected.message(), " (Gloo's peers could not connect within ",
                     absl::FormatDuration(absl::FromChrono(chrono_connect)),
                     ": every rank's worker must reach the others directly, on the interface "
                     "toward the coordinator or GLOO_SOCKET_IFNAME's; collective_backend auto "
                     "falls back to the coordinator's collectives instead)"));
  }
  DTRAIN_RETURN_IF_ERROR(connected);
  return backend;
}

GlooCollectiveBackend::~GlooCollectiveBackend() = default;

absl::Status GlooCollectiveBackend::Barrier(const std::string& name) {
  return Run("barrier", [&] { return gloo_->barrier(); });
}

absl::Status GlooCollectiveBackend::Broadcast(torch::Tensor& tensor, int src) {
  if (src < 0 || src >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast src ", src, " outside world of ", world_size()));
  }
  if (!tensor.device().is_cpu()) {
    return RunOnHost(
        tensor, [&](torch::Tensor& host) { return Broadcast(host, src); }, rank() != src);
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors = {tensor.is_contiguous() ? tensor : tensor.contiguous()};
  DTRAIN_RETURN_IF_ERROR(Run("broadcast", [&] {
    c10d::BroadcastOptions options;
    options.rootRank = src;
    return gloo_->broadcast(tensors, options);
  }));
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
  return absl::OkStatus();
}

absl::StatusOr<std::string> GlooCollectiveBackend::BroadcastBytes(const std::string& bytes,
                                                                  int src) {
  torch::Tensor size = torch::tensor({static_cast<int64_t>(rank() == src ? bytes.size() : 0)});
  DTRAIN_RETURN_IF_ERROR(Broadcast(size, src));
  const int64_t announced = size.item<int64_t>();
  // Every rank read the same length, so every rank refuses a large one alike and none waits in
  // the data's broadcast; a negative one only a broken peer sends, and abandoning closes the
  // connections that peer then waits on.
  if (absl::Status checked = CheckBroadcastBytesSize("gloo", src, announced); !checked.ok()) {
    return announced < 0 ? Abandon(checked) : checked;
  }
  torch::Tensor data;
  absl::Status allocated = GuardTorch("cannot allocate a broadcast's bytes", [&] {
    data = torch::empty({announced}, torch::kUInt8);
    return absl::OkStatus();
  });
  if (!allocated.ok()) {
    return Abandon(absl::ResourceExhaustedError(
        absl::StrCat("gloo broadcast on rank ", rank(), ": cannot hold the ", announced,
                     " bytes rank ", src, " sends: ", allocated.message())));
  }
  if (rank() == src && !bytes.empty()) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  if (data.numel() > 0) DTRAIN_RETURN_IF_ERROR(Broadcast(data, src));
  return std::string(static_cast<const char*>(data.data_ptr()), data.numel());
}

absl::Status GlooCollectiveBackend::AllReduce(torch::Tensor& tensor, v1::ReduceOp op) {
  if (!tensor.device().is_cpu()) {
    return RunOnHost(tensor, [&](torch::Tensor& host) { return AllReduce(host, op); });
  }
  DTRAIN_ASSIGN_OR_RETURN(c10d::ReduceOp gloo_op, ToGloo(op));
  if (op == v1::REDUCE_OP_MEAN && tensor.scalar_type() == torch::kBool) {
    return DivideForMean(tensor, world_size());
  }
  torch::NoGradGuard no_grad;
  if (WidenedForMean(tensor, op)) {
    torch::Tensor wide = tensor.to(torch::kInt64);
    DTRAIN_RETURN_IF_ERROR(AllReduce(wide, op));
    tensor.copy_(wide);
    return absl::OkStatus();
  }
  std::vector<torch::Tensor> tensors = {tensor.is_contiguous() ? tensor : tensor.contiguous()};
  DTRAIN_RETURN_IF_ERROR(Run("all_reduce", [&] {
    c10d::AllreduceOptions options;
    options.reduceOp = gloo_op;
    return gloo_->allreduce(tensors, options);
  }));
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
  return op == v1::REDUCE_OP_MEAN ? DivideForMean(tensor, world_size()) : absl::OkStatus();
}

absl::StatusOr<std::vector<torch::Tensor>> GlooCollectiveBackend::AllGather(
    const torch::Tensor& tensor) {
  if (!tensor.device().is_cpu()) {
    return AllGatherOnHost(tensor, [&](const torch::Tensor& host) { return AllGather(host); });
  }
  // Gloo gathers equal shapes: first each rank's first dimension, number of dimensions, dtype and
  // rows' shape (as RowShapeFingerprint), which must agree but for the first dimension; then
  // every tensor padded to the largest, then each cut back to its own size.
  const torch::Tensor input = tensor.dim() == 0 ? tensor.reshape({1}) : tensor.contiguous();
  const c10::IntArrayRef row_shape = input.sizes().slice(1);
  std::vector<torch::Tensor> sizes(world_size());
  for (auto& s : sizes) s = torch::zeros({4}, torch::kInt64);
  torch::Tensor my_size =
      torch::tensor({input.size(0), static_cast<int64_t>(tensor.dim()),
                     static_cast<int64_t>(input.scalar_type()), RowShapeFingerprint(row_shape)});
  std::vector<std::vector<torch::Tensor>> size_out = {sizes};
  std::vector<torch::Tensor> size_in = {my_size};
  DTRAIN_RETURN_IF_ERROR(Run("all_gather", [&] { return gloo_->allgather(size_out, size_in); }));
  sizes = size_out[0];
  int64_t largest = 0;
  for (int r = 0; r < world_size(); ++r) {
    const int64_t* theirs = sizes[r].data_ptr<int64_t>();
    const int64_t* mine = my_size.data_ptr<int64_t>();
    if (theirs[1] != mine[1] || theirs[2] != mine[2] || theirs[3] != mine[3]) {
      // Every rank sees every rank's, so each refuses before any data moves.
      auto describe = [&](const int64_t* d) {
        const std::string dtype = c10::toString(static_cast<c10::ScalarType>(d[2]));
        return d[1] == 0 ? absl::StrCat("a ", dtype, " scalar")
                         : absl::StrCat("a ", d[1], "-dimensional ", dtype, " tensor");
      };
      return absl::FailedPreconditionError(absl::StrCat(
          "mismatched all_gather: rank ", rank(), " gathers ", describe(mine),
          tensor.dim() > 1
              ? absl::StrCat(" with rows shaped [", absl::StrJoin(row_shape, ", "), "]")
              : "",
          ", rank ", r, " ", describe(theirs),
          theirs[1] == mine[1] && theirs[2] == mine[2] ? " with rows of another shape" : "",
          "; ranks may differ in the first dimension only"));
    }
    if (theirs[0] < 0) {
      return absl::InternalError(
          absl::StrCat("gloo all_gather: rank ", r, " announced ", theirs[0], " rows"));
    }
    largest = std::max(largest, theirs[0]);
  }
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = largest;
  torch::Tensor padded;
  std::vector<torch::Tensor> parts(world_size());
  absl::Status allocated = GuardTorch("cannot allocate the gathered parts", [&] {
    padded = torch::zeros(shape, input.options());
    padded.slice(0, 0, input.size(0)).copy_(input);
    for (auto& p : parts) p = torch::empty(shape, input.options());
    return absl::OkStatus();
  });
  if (!allocated.ok()) {
    // The peers are already in the data exchange: closing the connections ends their wait now,
    // not at the operation's deadline, and this rank's next call cannot pair with it.
    return Abandon(absl::ResourceExhaustedError(
        absl::StrCat("gloo all_gather on rank ", rank(), ": ", allocated.message())));
  }
  std::vector<std::vector<torch::Tensor>> part_out = {parts};
  std::vector<torch::Tensor> part_in = {padded};
  DTRAIN_RETURN_IF_ERROR(Run("all_gather", [&] { return gloo_->allgather(part_out, part_in); }));
  parts = part_out[0];
  for (int r = 0; r < world_size(); ++r) {
    parts[r] = parts[r].slice(0, 0, sizes[r][0].item<int64_t>()).clone();
    if (tensor.dim() == 0) parts[r] = parts[r].reshape({});
  }
  return parts;
}

absl::Status GlooCollectiveBackend::Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) {
  if (dst < 0 || dst >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce dst ", dst, " outside world of ", world_size()));
  }
  if (!tensor.device().is_cpu()) {
    return RunOnHost(
        tensor, [&](torch::Tensor& host) { return Reduce(host, dst, op); }, rank() == dst);
  }
  DTRAIN_ASSIGN_OR_RETURN(c10d::ReduceOp gloo_op, ToGloo(op));
  torch::Tensor work = WidenedForMean(tensor, op) ? tensor.contiguous().to(torch::kInt64)
                                                  : tensor.contiguous().clone();
  std::vector<torch::Tensor> tensors = {work};
  DTRAIN_RETURN_IF_ERROR(Run("reduce", [&] {
    c10d::ReduceOptions options;
    options.rootRank = dst;
    options.reduceOp = gloo_op;
    return gloo_->reduce(tensors, options);
  }));
  if (rank() != dst) return absl::OkStatus();
  if (op == v1::REDUCE_OP_MEAN) DTRAIN_RETURN_IF_ERROR(DivideForMean(work, world_size()));
  torch::NoGradGuard no_grad;
  tensor.copy_(work);
  return absl::OkStatus();
}

absl::StatusOr<bool> GlooCollectiveBackend::ReduceBooleanDecision(bool decision, bool all) {
  torch::Tensor t = torch::tensor({decision ? int64_t{1} : int64_t{0}});
  DTRAIN_RETURN_IF_ERROR(AllReduce(t, all ? v1::REDUCE_OP_MIN : v1::REDUCE_OP_MAX));
  return t.item<int64_t>() == 1;
}

absl::Status GlooCollectiveBackend::Leave() {
  // Nothing is in flight here (an abandoned operation took the process group with it), so
  // this joins idle threads and closes the connections now.
  gloo_.reset();
  broken_ = absl::FailedPreconditionError("this rank left the group");
  return group_->Leave();
}

}  // namespace dtrain

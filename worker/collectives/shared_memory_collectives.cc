// The shm plane's collectives that move data through the segment (shared_memory_segment.h):
// broadcast, broadcast_bytes, all_gather, reduce, reduce_boolean_decision and all_reduce, through
// the slots or in place in shared buffers. The segment's set-up and its waits are in
// shared_memory_collective_backend.cc.
#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <c10/util/accumulate.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/collectives/reduction_partition.h"
#include "worker/collectives/shared_memory_collective_backend.h"
#include "worker/collectives/shared_memory_segment.h"
#include "worker/model/torch_status.h"

namespace dtrain {

using shm::CallKind;
using shm::Describe;
using shm::PerRank;

namespace {

// out[k] = in[0] op in[1] op ... for `count` elements of `dtype` (float, double, int32 or int64:
// the kinds the segment reduces) at `offset` elements into each of `in` and `out`, in rank
// order: both all_reduce paths reduce through here, so their results are bitwise the same.
template <typename T>
void ReduceTyped(const PerRank<char*>& in, const PerRank<char*>& out, int64_t offset, int64_t count,
                 ReductionKind kind) {
  PerRank<const T*> ins;
  PerRank<T*> outs;
  for (char* p : in) ins.push_back(reinterpret_cast<const T*>(p) + offset);
  for (char* p : out) outs.push_back(reinterpret_cast<T*>(p) + offset);
  ReduceInRankOrder<T>(ins.data(), static_cast<int>(ins.size()), outs.data(),
                       static_cast<int>(outs.size()), count, kind);
}

void ReduceRaw(torch::ScalarType dtype, const PerRank<char*>& in, const PerRank<char*>& out,
               int64_t offset, int64_t count, v1::ReduceOp op) {
  const ReductionKind kind = op == v1::REDUCE_OP_MAX    ? ReductionKind::kMax
                             : op == v1::REDUCE_OP_MIN  ? ReductionKind::kMin
                             : op == v1::REDUCE_OP_MEAN ? ReductionKind::kMean
                                                        : ReductionKind::kSum;
  switch (dtype) {
    case torch::kFloat64:
      ReduceTyped<double>(in, out, offset, count, kind);
      break;
    case torch::kInt64:
      ReduceTyped<int64_t>(in, out, offset, count, kind);
      break;
    case torch::kInt32:
      ReduceTyped<int32_t>(in, out, offset, count, kind);
      break;
    default:
      ReduceTyped<float>(in, out, offset, count, kind);
  }
}

}  // namespace

absl::Status SharedMemoryCollectiveBackend::Broadcast(torch::Tensor& tensor, int src) {
  if (segment_ == nullptr) return inner_->Broadcast(tensor, src);
  if (src < 0 || src >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast src ", src, " outside world of ", world_));
  }
  if (!tensor.device().is_cpu()) {
    return RunOnHost(
        tensor, [&](torch::Tensor& host) { return Broadcast(host, src); }, rank() != src);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(rank()), call, CallKind::kBroadcast, tensor.numel(),
           static_cast<int32_t>(tensor.scalar_type()), src);
  DTRAIN_RETURN_IF_ERROR(MoveBytes(call, "broadcast", src, static_cast<char*>(flat.data_ptr()),
                                   flat.numel() * static_cast<int64_t>(flat.element_size())));
  if (rank() != src && !flat.is_same(tensor)) tensor.copy_(flat);
  return absl::OkStatus();
}

absl::Status SharedMemoryCollectiveBackend::MoveBytes(uint64_t call, const char* what, int src,
                                                      char* data, int64_t bytes) {
  const int me = rank();
  // At least one round, so that the descriptors are compared even for nothing to move.
  for (int64_t offset = 0, round = 0; round == 0 || offset < bytes;
       offset += slot_bytes_, ++round) {
    const int b = static_cast<int>(round % 2);
    const int64_t count = std::min(slot_bytes_, bytes - offset);
    if (me == src && count > 0) std::memcpy(segment_->slot(b, src), data + offset, count);
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait(what));
    if (round == 0) DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
    if (count <= 0) break;
    if (me != src) std::memcpy(data + offset, segment_->slot(b, src), count);
    // The source may not refill this buffer set before every rank has read it.
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait(what));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SharedMemoryCollectiveBackend::BroadcastBytes(const std::string& bytes,
                                                                          int src) {
  if (segment_ == nullptr) return inner_->BroadcastBytes(bytes, src);
  if (src < 0 || src >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast src ", src, " outside world of ", world_));
  }
  if (!broken_.ok()) return broken_;
  const int me = rank();
  const uint64_t call = ++calls_;
  // The length travels in the source's descriptor; the bytes through the slots.
  Describe(segment_->arrival(me), call, CallKind::kBroadcastBytes, 0, 0, src, -1,
           me == src ? static_cast<int64_t>(bytes.size()) : 0);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("broadcast"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  const int64_t size = segment_->arrival(src).descriptors[call % 2].value;
  // Every rank read the same length, so every rank refuses a large one alike and the plane stays
  // whole; a negative one only a broken peer sends, and poisoning the plane stops the others.
  if (absl::Status checked = CheckBroadcastBytesSize("shm", src, size); !checked.ok()) {
    return size < 0 ? Poison(checked) : checked;
  }
  std::string out;
  try {
    out = me == src ? bytes : std::string(static_cast<size_t>(size), '\0');
  } catch (const std::bad_alloc&) {
    // The others would wait for this rank's arrival until the deadline: stop them now.
    return Poison(absl::ResourceExhaustedError(
        absl::StrCat("shm broadcast: cannot hold the ", size, " bytes rank ", src, " sends")));
  }
  const uint64_t data_call = ++calls_;
  Describe(segment_->arrival(me), data_call, CallKind::kBroadcastBytes, size, 0, src);
  DTRAIN_RETURN_IF_ERROR(MoveBytes(data_call, "broadcast", src, out.data(), size));
  return out;
}

absl::StatusOr<std::vector<torch::Tensor>> SharedMemoryCollectiveBackend::AllGather(
    const torch::Tensor& tensor) {
  if (segment_ == nullptr) return inner_->AllGather(tensor);
  if (!tensor.device().is_cpu()) {
    return AllGatherOnHost(tensor, [&](const torch::Tensor& host) { return AllGather(host); });
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  // Dimension 0 may differ between ranks; the dtype, the number of dimensions (a scalar's is 0,
  // though it travels as one row) and the rows' shape may not (the descriptor compares them), and
  // each row is whole in the slots.
  const torch::Tensor input = tensor.dim() == 0 ? tensor.reshape({1}) : tensor.contiguous();
  const int world = world_, me = rank();
  const int64_t rows = input.size(0);
  const std::vector<int64_t> row_shape(input.sizes().begin() + 1, input.sizes().end());
  // From the shape, not numel() / rows: a rank with no rows still describes its rows' size.
  const int64_t row_elements = c10::multiply_integers(row_shape);
  const int64_t row_bytes = row_elements * static_cast<int64_t>(input.element_size());
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(me), call, CallKind::kAllGather, row_elements,
           static_cast<int32_t>(input.scalar_type()), static_cast<int32_t>(tensor.dim()),
           RowShapeFingerprint(row_shape), rows);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_gather"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call, row_shape));
  std::vector<int64_t> bytes(world);
  std::vector<torch::Tensor> parts(world);
  int64_t largest = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t r_rows = segment_->arrival(r).descriptors[call % 2].value;
    if (r_rows < 0 || (row_bytes > 0 && r_rows > (int64_t{1} << 40) / row_bytes)) {
      return Poison(absl::InternalError(
          absl::StrCat("shm all_gather: rank ", r, " announced ", r_rows, " rows")));
    }
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = r_rows;
    // A rank that cannot hold the parts stops every rank at once, not at the deadline.
    absl::StatusOr<torch::Tensor> part =
        GuardTorch("shm all_gather: cannot allocate the gathered parts",
                   [&]() -> absl::StatusOr<torch::Tensor> {
                     return r == me ? input.clone() : torch::empty(shape, input.options());
                   });
    if (!part.ok()) return Poison(part.status());
    parts[r] = *std::move(part);
    bytes[r] = r_rows * row_bytes;
    largest = std::max(largest, bytes[r]);
  }
  const char* mine = static_cast<const char*>(input.data_ptr());
  for (int64_t offset = 0, round = 0; offset < largest; offset += slot_bytes_, ++round) {
    // After the descriptors' barrier: two barriers a round, each round a buffer set of its own.
    const int b = static_cast<int>(round % 2);
    const int64_t count = std::clamp<int64_t>(bytes[me] - offset, 0, slot_bytes_);
    if (count > 0) std::memcpy(segment_->slot(b, me), mine + offset, count);
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_gather"));
    for (int r = 0; r < world; ++r) {
      const int64_t theirs = std::clamp<int64_t>(bytes[r] - offset, 0, slot_bytes_);
      if (r != me && theirs > 0) {
        std::memcpy(static_cast<char*>(parts[r].data_ptr()) + offset, segment_->slot(b, r), theirs);
      }
    }
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_gather"));
  }
  if (tensor.dim() == 0) {
    for (torch::Tensor& p : parts) p = p.reshape({});
  }
  return parts;
}

absl::Status SharedMemoryCollectiveBackend::Reduce(torch::Tensor& tensor, int dst,
                                                   v1::ReduceOp op) {
  if (segment_ == nullptr) return inner_->Reduce(tensor, dst, op);
  if (dst < 0 || dst >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce dst ", dst, " outside world of ", world_));
  }
  if (!tensor.device().is_cpu()) {
    return RunOnHost(
        tensor, [&](torch::Tensor& host) { return Reduce(host, dst, op); }, rank() == dst);
  }
  const int32_t described = (dst << 8) | static_cast<int32_t>(op);
  if (!ReducedHere(tensor, op)) {
    DTRAIN_RETURN_IF_ERROR(Announce(static_cast<int32_t>(CallKind::kReduce), tensor.numel(),
                                    static_cast<int32_t>(tensor.scalar_type()), described,
                                    "reduce"));
    return inner_->Reduce(tensor, dst, op);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
  DTRAIN_RETURN_IF_ERROR(
      ReduceChunks(flat, op, static_cast<int32_t>(CallKind::kReduce), described, rank() == dst));
  if (rank() == dst && flat.data_ptr() != tensor.data_ptr()) {
    tensor.copy_(flat.view(tensor.sizes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SharedMemoryCollectiveBackend::ReduceBooleanDecision(bool decision, bool all) {
  if (segment_ == nullptr) return inner_->ReduceBooleanDecision(decision, all);
  if (!broken_.ok()) return broken_;
  // The votes travel in the descriptors, which stay readable until every rank has arrived in
  // the call after this one: one barrier is the whole collective.
  const uint64_t call = ++calls_;
  Describe(segment_->arrival(rank()), call, CallKind::kReduceBooleanDecision, 0, 0, all ? 1 : 0, -1,
           decision ? 1 : 0);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("reduce_boolean_decision"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  bool every = true, some = false;
  for (int r = 0; r < world_; ++r) {
    const bool vote = segment_->arrival(r).descriptors[call % 2].value != 0;
    every = every && vote;
    some = some || vote;
  }
  return all ? every : some;
}

absl::Status SharedMemoryCollectiveBackend::AllReduce(torch::Tensor& tensor, v1::ReduceOp op) {
  // A CUDA tensor is reduced here through a host copy, not handed to the inner plane: this
  // plane is the one a CUDA job's gradients really travel on (and the one reported).
  if (!tensor.device().is_cpu()) {
    return RunOnHost(tensor, [&](torch::Tensor& host) { return AllReduce(host, op); });
  }
  if (segment_ == nullptr) return inner_->AllReduce(tensor, op);
  if (!ReducedHere(tensor, op)) {
    DTRAIN_RETURN_IF_ERROR(Announce(static_cast<int32_t>(CallKind::kAllReduce), tensor.numel(),
                                    static_cast<int32_t>(tensor.scalar_type()), op, "all_reduce"));
    return inner_->AllReduce(tensor, op);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  if (const SharedBuffer* shared = FindSharedBuffer(tensor); shared != nullptr) {
    const int64_t offset =
        (static_cast<char*>(tensor.data_ptr()) - shared->bases[rank()]) / tensor.element_size();
    return ReduceInPlace(*shared, offset, tensor.numel(), tensor.scalar_type(), op);
  }
  torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
  DTRAIN_RETURN_IF_ERROR(
      ReduceChunks(flat, op, static_cast<int32_t>(CallKind::kAllReduce), op, /*lands_here=*/true));
  if (!flat.is_same(tensor) && flat.data_ptr() != tensor.data_ptr()) {
    tensor.copy_(flat.view(tensor.sizes()));
  }
  return absl::OkStatus();
}

bool SharedMemoryCollectiveBackend::ReducedHere(const torch::Tensor& tensor, v1::ReduceOp op) {
  const torch::ScalarType t = tensor.scalar_type();
  return (t == torch::kFloat32 || t == torch::kFloat64 || t == torch::kBFloat16 ||
          t == torch::kHalf || t == torch::kInt32 || t == torch::kInt64) &&
         (op == v1::REDUCE_OP_SUM || op == v1::REDUCE_OP_MEAN || op == v1::REDUCE_OP_MAX ||
          op == v1::REDUCE_OP_MIN);
}

absl::Status SharedMemoryCollectiveBackend::ReduceChunks(torch::Tensor& flat, v1::ReduceOp op,
                                                         int32_t kind, int32_t described,
                                                         bool lands_here) {
  const int world = world_size(), me = rank();
  const uint64_t call = ++calls_;
  const int64_t n = flat.numel();
  Describe(segment_->arrival(me), call, static_cast<CallKind>(kind), n,
           static_cast<int32_t>(flat.scalar_type()), described);
  // 16-bit floats (bf16-true's gradient buckets) are widened into float32 slots on the way in
  // and rounded once on the way out, and an int32 mean is summed in int64 before it is divided,
  // as the coordinator's plane reduces them.
  const torch::ScalarType dtype = flat.scalar_type();
  const torch::ScalarType slot_type =
      dtype == torch::kBFloat16 || dtype == torch::kHalf   ? torch::kFloat32
      : dtype == torch::kInt32 && op == v1::REDUCE_OP_MEAN ? torch::kInt64
                                                           : dtype;
  const int64_t slot_element = static_cast<int64_t>(c10::elementSize(slot_type));
  const int64_t per_chunk = slot_bytes_ / slot_element;
  const auto options = torch::TensorOptions().dtype(slot_type);
  auto view = [&](int buffer, int s, int64_t begin, int64_t count) {
    return torch::from_blob(segment_->slot(buffer, s) + begin * slot_element, {count}, options);
  };
  // A chunk loop of at least one round, so that the descriptors are compared even for an
  // empty tensor.
  int chunk = 0;
  for (int64_t offset = 0; chunk == 0 || offset < n; offset += per_chunk, ++chunk) {
    const int b = chunk % 2;
    const int64_t count = std::min(per_chunk, n - offset);
    if (count > 0) view(b, me, 0, count).copy_(flat.slice(0, offset, offset + count));
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_reduce"));
    if (chunk == 0) DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
    if (count <= 0) break;
    // This rank's partition, reduced over the ranks in rank order (slots start on a page).
    const auto [begin, end] = ReductionPartOf(count, me, world, 0, slot_element);
    if (end > begin) {
      PerRank<char*> in;
      for (int r = 0; r < world; ++r) in.push_back(segment_->slot(b, r));
      ReduceRaw(slot_type, in, {segment_->slot(b, world)}, begin, end - begin, op);
    }
    DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_reduce"));
    if (lands_here) flat.slice(0, offset, offset + count).copy_(view(b, world, 0, count));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryCollectiveBackend::AllReduceThenUpdate(
    torch::Tensor& tensor, v1::ReduceOp op, torch::Tensor& mirror, const SplitUpdate& update,
    const torch::Tensor& source, bool result_everywhere) {
  const SharedBuffer* shared = nullptr;
  const SharedBuffer* mirrored = nullptr;
  if (segment_ != nullptr && tensor.device().is_cpu() && ReducedHere(tensor, op) &&
      mirror.numel() == tensor.numel() && mirror.scalar_type() == tensor.scalar_type()) {
    shared = FindSharedBuffer(tensor);
    mirrored = FindSharedBuffer(mirror);
  }
  // Both buffers come from AllocateForAllReduce on every rank alike, so every rank takes the
  // same branch.
  if (shared == nullptr || mirrored == nullptr) {
    return CollectiveBackend::AllReduceThenUpdate(tensor, op, mirror, update, source,
                                                  result_everywhere);
  }
  if (!broken_.ok()) return broken_;
  torch::NoGradGuard no_grad;
  const int64_t element = tensor.element_size();
  // A source the peers cannot read is copied in (a rank's choice alone: each rank describes
  // where its input lies).
  const SharedBuffer* sourced = nullptr;
  int64_t source_offset = 0;
  if (source.defined() && !source.is_same(tensor)) {
    DTRAIN_RETURN_IF_ERROR(SameElements("source", source, tensor));
    sourced = FindSharedBuffer(source);
    if (sourced != nullptr) {
      source_offset = (static_cast<char*>(source.data_ptr()) - sourced->bases[rank()]) / element;
    } else {
      tensor.copy_(source.reshape({-1}));
    }
  }
  const int64_t offset = (static_cast<char*>(tensor.data_ptr()) - shared->bases[rank()]) / element;
  const int64_t mirror_offset =
      (static_cast<char*>(mirror.data_ptr()) - mirrored->bases[rank()]) / element;
  return ReduceInPlace(*shared, offset, tensor.numel(), tensor.scalar_type(), op, mirrored,
                       mirror_offset, &update, sourced, source_offset, result_everywhere);
}

absl::Status SharedMemoryCollectiveBackend::ReduceInPlace(
    const SharedBuffer& buffer, int64_t offset, int64_t numel, torch::ScalarType dtype,
    v1::ReduceOp op, const SharedBuffer* mirror, int64_t mirror_offset, const SplitUpdate* update,
    const SharedBuffer* source, int64_t source_offset, bool result_everywhere) {
  const int world = world_, me = rank();
  const uint64_t call = ++calls_;
  // Where this rank's input lies, if not in `buffer`: not compared (the ranks' may differ).
  const int64_t input = source != nullptr ? (source->index << 40) + source_offset : -1;
  // Where the result lands is compared too: ranks that disagree would leave some of it
  // unaveraged, silently.
  Describe(segment_->arrival(me), call,
           update != nullptr ? CallKind::kAllReduceThenUpdate : CallKind::kAllReduce, numel,
           static_cast<int32_t>(dtype), op, (buffer.index << 40) + offset, input,
           result_everywhere ? 0 : 1);
  DTRAIN_RETURN_IF_ERROR(ArriveAndWait("all_reduce"));
  DTRAIN_RETURN_IF_ERROR(MatchCalls(call));
  // This rank's partition, reduced in one pass from every rank's memory into every rank's (every
  // rank's mapping starts on a page, so `offset` places the tensor's lines alike everywhere).
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const auto [begin, end] = ReductionPartOf(numel, me, world, offset * element, element);
  if (end > begin) {
    PerRank<char*> ins, outs;
    for (int r = 0; r < world; ++r) {
      outs.push_back(buffer.bases[r] + offset * element);
      const int64_t at =
          update != nullptr ? segment_->arrival(r).descriptors[call % 2].value : int64_t{-1};
      if (at < 0) {
        ins.push_back(outs.back());
        continue;
      }
      const uint64_t index = static_cast<uint64_t>(at) >> 40;
      const int64_t first = at & ((int64_t{1} << 40) - 1);
      if (index >= shared_buffers_.size() || shared_buffers_[index]->dtype != dtype ||
          static_cast<size_t>((first + numel) * element) > shared_buffers_[index]->bytes ||
          shared_buffers_[index].get() == &buffer) {
        return Poison(absl::InternalError(
            absl::StrCat("all_reduce #", call, ": rank ", r, " described its input at buffer ",
                         index, ", element ", first, ": not a shared buffer of its own of ",
                         c10::toString(dtype), " holding ", numel, " elements")));
      }
      ins.push_back(shared_buffers_[index]->bases[r] + first * element);
      ++inputs_read_in_place_;
    }
    if (result_everywhere) {
      ReduceRaw(dtype, ins, outs, begin, end - begin, op);
    } else {
      ReduceRaw(dtype, ins, {outs[me]}, begin, end - begin, op);
    }
  }
  if (update != nullptr && end > begin) {
    // The partition this rank reduced is in its cache: it updates it, and the others get it.
    // The peers wait for this rank's part at the barrier: a failure must reach them now.
    absl::Status updated;
    try {
      updated = (*update)(begin, end);
    } catch (const std::exception& e) {
      updated = absl::InternalError(absl::StrCat("the update after an all_reduce: ", e.what()));
    }
    if (!updated.ok()) return Poison(updated);
    const char* mine = mirror->bases[me] + (mirror_offset + begin) * element;
    for (int r = 0; r < world; ++r) {
      if (r != me) {
        std::memcpy(mirror->bases[r] + (mirror_offset + begin) * element, mine,
                    static_cast<size_t>((end - begin) * element));
      }
    }
  }
  // Nobody reads the result before every rank has written its partition everywhere.
  return ArriveAndWait("all_reduce");
}

}  // namespace dtrain

#include "worker/collectives/collective_backend.h"

#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/tensor_convert.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

// Writes a wire tensor's values into an existing torch tensor of the same element count.
absl::Status CopyInto(const HostTensor& wire, torch::Tensor& tensor) {
  DTRAIN_ASSIGN_OR_RETURN(torch::Tensor result, ToTorch(wire));
  if (result.numel() != tensor.numel()) {
    return absl::InternalError(absl::StrCat("collective returned ", result.numel(),
                                            " elements for a tensor of ", tensor.numel()));
  }
  torch::NoGradGuard no_grad;
  tensor.copy_(result.view(tensor.sizes()));
  return absl::OkStatus();
}

absl::Status CheckOp(v1::ReduceOp op) {
  if (op == v1::REDUCE_OP_UNSPECIFIED || !v1::ReduceOp_IsValid(op)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int>(op)));
  }
  return absl::OkStatus();
}

thread_local bool overlapped_waits = false;

}  // namespace

absl::Status CheckBroadcastBytesSize(const char* plane, int src, int64_t size) {
  if (size < 0) {
    return absl::InternalError(
        absl::StrCat(plane, " broadcast: rank ", src, " announced ", size, " bytes"));
  }
  if (size > kMostBroadcastBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        plane, " broadcast: rank ", src, " broadcasts ", size, " bytes, over the ",
        kMostBroadcastBytes,
        " a broadcast of bytes may carry (send larger data as a tensor, or through a file)"));
  }
  return absl::OkStatus();
}

ScopedOverlappedWaits::ScopedOverlappedWaits() : was_(overlapped_waits) { overlapped_waits = true; }
ScopedOverlappedWaits::~ScopedOverlappedWaits() { overlapped_waits = was_; }
bool ScopedOverlappedWaits::active() { return overlapped_waits; }

absl::Status RunOnHost(torch::Tensor& tensor, const std::function<absl::Status(torch::Tensor&)>& op,
                       bool lands_here) {
  if (tensor.device().is_cpu()) return op(tensor);
  torch::NoGradGuard no_grad;
  DTRAIN_ASSIGN_OR_RETURN(torch::Tensor host,
                          GuardTorch("cannot copy a collective's tensor to the host",
                                     [&]() -> absl::StatusOr<torch::Tensor> {
                                       return tensor.to(torch::kCPU).contiguous();
                                     }));
  DTRAIN_RETURN_IF_ERROR(op(host));
  if (!lands_here) return absl::OkStatus();
  return GuardTorch("cannot copy a collective's result back to " + tensor.device().str(),
                    [&]() -> absl::Status {
                      tensor.copy_(host);
                      return absl::OkStatus();
                    });
}

absl::StatusOr<std::vector<torch::Tensor>> OnDeviceOf(std::vector<torch::Tensor> parts,
                                                      const torch::Tensor& like) {
  return GuardTorch("cannot copy all_gather's parts to " + like.device().str(),
                    [&]() -> absl::StatusOr<std::vector<torch::Tensor>> {
                      for (torch::Tensor& part : parts) {
                        if (part.device() != like.device()) part = part.to(like.device());
                      }
                      return std::move(parts);
                    });
}

absl::StatusOr<std::vector<torch::Tensor>> AllGatherOnHost(
    const torch::Tensor& tensor,
    const std::function<absl::StatusOr<std::vector<torch::Tensor>>(const torch::Tensor&)>& gather) {
  if (tensor.device().is_cpu()) return gather(tensor);
  DTRAIN_ASSIGN_OR_RETURN(
      torch::Tensor host,
      GuardTorch("cannot copy all_gather's tensor to the host",
                 [&]() -> absl::StatusOr<torch::Tensor> { return tensor.to(torch::kCPU); }));
  DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> parts, gather(host));
  return OnDeviceOf(std::move(parts), tensor);
}

int64_t RowShapeFingerprint(c10::IntArrayRef row_shape) {
  // FNV-1a over the dimensions' bytes: absl::Hash is seeded per process, so it cannot be compared
  // between ranks. Non-negative, so that it never equals a descriptor's -1.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int64_t d : row_shape) {
    for (int byte = 0; byte < 8; ++byte) {
      h = (h ^ ((static_cast<uint64_t>(d) >> (8 * byte)) & 0xff)) * 0x100000001b3ULL;
    }
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffULL);
}

absl::StatusOr<torch::Tensor> CollectiveBackend::AllocateForAllReduce(int64_t numel,
                                                                      torch::ScalarType dtype) {
  if (numel < 0) return absl::InvalidArgumentError(absl::StrCat("numel must be >= 0, got ", numel));
  return at::zeros({numel}, at::TensorOptions().dtype(dtype));
}

absl::Status CollectiveBackend::SameElements(const char* what, const torch::Tensor& other,
                                             const torch::Tensor& tensor) {
  if (other.numel() == tensor.numel() && other.scalar_type() == tensor.scalar_type()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("all_reduce then update: the ", what, " holds ", other.numel(), " ",
                   c10::toString(other.scalar_type()), ", the tensor ", tensor.numel(), " ",
                   c10::toString(tensor.scalar_type())));
}

absl::Status CollectiveBackend::AllReduceThenUpdate(torch::Tensor& tensor, v1::ReduceOp op,
                                                    torch::Tensor& mirror,
                                                    const SplitUpdate& update,
                                                    const torch::Tensor& source,
                                                    bool /*result_everywhere*/) {
  DTRAIN_RETURN_IF_ERROR(SameElements("mirror", mirror, tensor));
  if (source.defined()) {
    DTRAIN_RETURN_IF_ERROR(SameElements("source", source, tensor));
    torch::NoGradGuard no_grad;
    if (!source.is_same(tensor)) tensor.view({-1}).copy_(source.reshape({-1}));
  }
  DTRAIN_RETURN_IF_ERROR(AllReduce(tensor, op));
  return update(0, tensor.numel());
}

absl::Status GrpcCollectiveBackend::Broadcast(torch::Tensor& tensor, int src) {
  HostTensor wire;
  if (rank() == src) {
    DTRAIN_ASSIGN_OR_RETURN(wire, FromTorch(tensor));
  }
  DTRAIN_ASSIGN_OR_RETURN(HostTensor got, group_->Broadcast(src, rank() == src ? &wire : nullptr));
  if (rank() == src) return absl::OkStatus();
  return CopyInto(got, tensor);
}

absl::StatusOr<std::string> GrpcCollectiveBackend::BroadcastBytes(const std::string& bytes,
                                                                  int src) {
  return group_->BroadcastBytes(src, rank() == src ? &bytes : nullptr);
}

absl::Status GrpcCollectiveBackend::AllReduce(torch::Tensor& tensor, v1::ReduceOp op) {
  DTRAIN_ASSIGN_OR_RETURN(HostTensor wire, FromTorch(tensor));
  DTRAIN_RETURN_IF_ERROR(group_->AllReduceInPlace(&wire, op));
  return CopyInto(wire, tensor);
}

absl::StatusOr<std::vector<torch::Tensor>> GrpcCollectiveBackend::AllGather(
    const torch::Tensor& tensor) {
  DTRAIN_ASSIGN_OR_RETURN(HostTensor wire, FromTorch(tensor));
  DTRAIN_ASSIGN_OR_RETURN(std::vector<HostTensor> parts, group_->AllGather(wire));
  std::vector<torch::Tensor> out;
  out.reserve(parts.size());
  for (const HostTensor& part : parts) {
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor t, ToTorch(part));
    out.push_back(std::move(t));
  }
  return OnDeviceOf(std::move(out), tensor);
}

absl::Status GrpcCollectiveBackend::Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) {
  DTRAIN_ASSIGN_OR_RETURN(HostTensor wire, FromTorch(tensor));
  DTRAIN_ASSIGN_OR_RETURN(std::optional<HostTensor> got, group_->Reduce(wire, op, dst));
  if (!got.has_value()) return absl::OkStatus();
  return CopyInto(*got, tensor);
}

absl::Status LocalCollectiveBackend::Broadcast(torch::Tensor&, int src) {
  if (src != 0) return absl::InvalidArgumentError(absl::StrCat("src ", src, " outside world of 1"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> LocalCollectiveBackend::BroadcastBytes(const std::string& bytes,
                                                                   int src) {
  if (src != 0) return absl::InvalidArgumentError(absl::StrCat("src ", src, " outside world of 1"));
  return bytes;
}

absl::Status LocalCollectiveBackend::AllReduce(torch::Tensor& tensor, v1::ReduceOp op) {
  DTRAIN_RETURN_IF_ERROR(CheckOp(op));
  // The mean of one integer value is itself, as the coordinator's (truncating) mean gives.
  return absl::OkStatus();
}

absl::Status LocalCollectiveBackend::Reduce(torch::Tensor& tensor, int dst, v1::ReduceOp op) {
  if (dst != 0) return absl::InvalidArgumentError(absl::StrCat("dst ", dst, " outside world of 1"));
  return CheckOp(op);
}

}  // namespace dtrain

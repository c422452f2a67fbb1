#include "worker/gradient_sync.h"

#include <torch/torch.h>

#include "common/status_macros.h"

namespace dtrain {
namespace {

// Flattens `tensors` into one contiguous buffer, runs one collective on it, and writes the
// result back into `tensors`.
template <typename Collective>
absl::Status OverFlat(const std::vector<torch::Tensor>& tensors, Collective collective) {
  if (tensors.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_parts;
  flat_parts.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) flat_parts.push_back(t.reshape({-1}));
  torch::Tensor result = torch::cat(flat_parts);
  DTRAIN_RETURN_IF_ERROR(collective(result));
  int64_t offset = 0;
  for (const torch::Tensor& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(result.slice(0, offset, offset + n).view(t.sizes()));
    offset += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BroadcastTensors(CollectiveBackend* backend,
                              const std::vector<torch::Tensor>& tensors, int src) {
  // Tensors of different dtypes cannot share one flat buffer: one broadcast per dtype run.
  std::vector<torch::Tensor> run;
  auto flush = [&]() -> absl::Status {
    absl::Status status = OverFlat(run, [&](torch::Tensor& flat) {
      return backend->Broadcast(flat, src);
    });
    run.clear();
    return status;
  };
  for (const torch::Tensor& t : tensors) {
    if (!run.empty() && run.back().scalar_type() != t.scalar_type()) {
      DTRAIN_RETURN_IF_ERROR(flush());
    }
    run.push_back(t);
  }
  return flush();
}

GradientSync::GradientSync(CollectiveBackend* backend, std::vector<torch::Tensor> parameters,
                           int64_t bucket_bytes)
    : backend_(backend), parameters_(std::move(parameters)) {
  // Consecutive parameters of one dtype share a bucket until it would exceed bucket_bytes.
  int64_t filled = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const torch::Tensor& p = parameters_[i];
    const int64_t bytes = p.numel() * p.element_size();
    const bool new_bucket =
        buckets_.empty() || filled + bytes > bucket_bytes ||
        parameters_[buckets_.back().back()].scalar_type() != p.scalar_type();
    if (new_bucket) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(i);
    filled += bytes;
  }
}

absl::Status GradientSync::BroadcastParameters(int src) {
  for (const std::vector<size_t>& bucket : buckets_) {
    std::vector<torch::Tensor> tensors;
    for (size_t i : bucket) tensors.push_back(parameters_[i]);
    DTRAIN_RETURN_IF_ERROR(BroadcastTensors(backend_, tensors, src));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::AverageGradients() {
  for (const std::vector<size_t>& bucket : buckets_) {
    std::vector<torch::Tensor> grads;
    for (size_t i : bucket) {
      torch::Tensor& p = parameters_[i];
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
    DTRAIN_RETURN_IF_ERROR(OverFlat(grads, [&](torch::Tensor& flat) {
      return backend_->AllReduce(flat, v1::REDUCE_OP_MEAN);
    }));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

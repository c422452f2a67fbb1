// Helpers shared by the worker's libtorch tests (worker_*_test.cc).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/process_group.h"
#include "worker/collectives/collective_backend.h"
#include "worker/collectives/gloo_collective_backend.h"
#include "worker/collectives/shared_memory_collective_backend.h"

namespace dtrain {

// A device that is not the CPU on this CPU build of libtorch: its lazy tensors (the TorchScript
// backend), whose data must be copied to the host and back as CUDA tensors' must. A plane that
// answered with host tensors (as the grpc plane's all_gather once did for CUDA inputs) fails.
inline torch::Device NonCpuDevice() {
  static std::once_flag once;
  std::call_once(once, [] { torch::lazy::InitTorchScriptBackend(); });
  return torch::Device(torch::kLazy, 0);
}

// Ten classes of 28x28 "images": class c lights up rows 2c..2c+2, plus noise. Learnable, fast.
// A generator of its own per batch: ranks in threads must not share torch's global one.
inline std::pair<torch::Tensor, torch::Tensor> SyntheticBatch(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::Tensor y = torch::randint(0, 10, {n}, gen, torch::kInt64);
  torch::Tensor x = torch::randn({n, 1, 28, 28}, gen) * 0.3;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = y[i].item<int64_t>();
    x.index({i, 0, torch::indexing::Slice(2 * c, 2 * c + 3)}) += 1.0;
  }
  return {x, y};
}

// The sum of the squares of the first `count` of `parameters`: a loss whose backward reaches
// exactly those (gradient 2p each).
inline torch::Tensor SumOfSquares(const std::vector<torch::Tensor>& parameters, size_t count) {
  torch::Tensor sum = torch::zeros({});
  for (size_t i = 0; i < count && i < parameters.size(); ++i) {
    sum = sum + (parameters[i] * parameters[i]).sum();
  }
  return sum;
}

// Makes the named backend ("grpc", "gloo" or "shm") over a joined group.
inline absl::StatusOr<std::unique_ptr<CollectiveBackend>> MakeBackend(const std::string& kind,
                                                                      const std::string& address,
                                                                      ProcessGroup* pg,
                                                                      absl::Duration timeout) {
  if (kind == "grpc") return std::unique_ptr<CollectiveBackend>(new GrpcCollectiveBackend(pg));
  if (kind == "gloo") return GlooCollectiveBackend::Make(address, pg, timeout);
  // As ConnectCollectivePlane makes it: over the coordinator's plane, no Gloo.
  auto shm =
      SharedMemoryCollectiveBackend::Make(std::make_unique<GrpcCollectiveBackend>(pg), timeout);
  if (!shm.ok()) return shm.status();
  // On one machine the shared-memory path must be the one under test.
  if (!(*shm)->active()) return absl::InternalError("shm inactive: " + (*shm)->fallback_reason());
  return shm;
}

}  // namespace dtrain

// dtrain-bench-collectives-gloo: one rank of the collectives benchmark over dtrain's
// peer-to-peer data plane: membership and rendezvous through the coordinator, the collectives
// through GlooCollectiveBackend (--backend=gloo, system "dtrain-gloo") or, between ranks on
// this host, shared memory over the coordinator's plane (--backend=shm, system "dtrain-shm"),
// as a ddp job with collective_backend: gloo or shm runs them.
#include <cstdio>

#include <torch/types.h>

#include "absl/flags/flag.h"
#include "bench/collectives_runner.h"
#include "worker/collectives/gloo_collective_backend.h"
#include "worker/collectives/shared_memory_collective_backend.h"

ABSL_FLAG(std::string, backend, "gloo", "gloo | shm");

int main(int argc, char** argv) {
  dtrain::bench::InitBench(argc, argv);
  std::unique_ptr<dtrain::ProcessGroup> joined = dtrain::bench::JoinOrExit();
  const std::string kind = absl::GetFlag(FLAGS_backend);
  std::unique_ptr<dtrain::CollectiveBackend> backend;
  if (kind == "shm") {
    // As a job's plane makes it (collective_plane.cc): over the coordinator's plane, no Gloo.
    auto shm = dtrain::SharedMemoryCollectiveBackend::Make(
        std::make_unique<dtrain::GrpcCollectiveBackend>(std::move(joined)), absl::Seconds(60));
    if (!shm.ok() || !(*shm)->active()) {
      std::fprintf(stderr, "shm: %s\n",
                   shm.ok() ? (*shm)->fallback_reason().c_str() : shm.status().ToString().c_str());
      return 1;
    }
    backend = std::move(*shm);
  } else if (kind == "gloo") {
    auto made = dtrain::GlooCollectiveBackend::Make(dtrain::bench::CoordinatorFromFlags(),
                                                    std::move(joined), absl::Seconds(60));
    if (!made.ok()) {
      std::fprintf(stderr, "gloo: %s\n", made.status().ToString().c_str());
      return 1;
    }
    backend = std::move(*made);
  } else {
    std::fprintf(stderr, "--backend must be gloo or shm\n");
    return 2;
  }
  dtrain::CollectiveBackend& gloo = *backend;
  torch::Tensor buffer;
  dtrain::bench::CollectiveOps ops;
  ops.system = "dtrain-" + kind;
  ops.rank = gloo.rank();
  ops.world_size = gloo.world_size();
  ops.barrier = [&] { return gloo.Barrier("b"); };
  ops.prepare = [&](int64_t bytes) {
    buffer = torch::zeros({bytes / 4}, torch::kFloat32);
    return absl::OkStatus();
  };
  ops.all_reduce = [&] { return gloo.AllReduce(buffer, dtrain::v1::REDUCE_OP_SUM); };
  ops.broadcast = [&] { return gloo.Broadcast(buffer, 0); };
  ops.all_gather = [&] { return gloo.AllGather(buffer).status(); };
  ops.agree = [&](int value) -> absl::StatusOr<int> {
    torch::Tensor t = torch::tensor({value}, torch::kInt32);
    if (absl::Status s = gloo.Broadcast(t, 0); !s.ok()) return s;
    return t.item<int>();
  };
  const int code = dtrain::bench::RunCollectivesBench(ops, dtrain::bench::PlanFromFlags());
  (void)gloo.Leave();
  return code;
}

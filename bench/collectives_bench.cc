// dtrain-bench-collectives: one rank of the collectives benchmark over the coordinator's gRPC
// collectives (system "dtrain-grpc"). Every rank of a run is its own process, as
// torch.distributed's are. No libtorch: HostTensor buffers, as the client library offers them.
#include <cstdio>

#include "bench/collectives_runner.h"
#include "client/process_group.h"

int main(int argc, char** argv) {
  dtrain::bench::InitBench(argc, argv);
  std::unique_ptr<dtrain::ProcessGroup> joined = dtrain::bench::JoinOrExit();
  dtrain::ProcessGroup& pg = *joined;
  dtrain::HostTensor buffer;
  dtrain::bench::CollectiveOps ops;
  ops.system = "dtrain-grpc";
  ops.rank = pg.rank();
  ops.world_size = pg.world_size();
  ops.barrier = [&] { return pg.Barrier("b"); };
  ops.prepare = [&](int64_t bytes) -> absl::Status {
    auto zeros = dtrain::HostTensor::Zeros(dtrain::v1::DTYPE_FLOAT32, {bytes / 4});
    if (!zeros.ok()) return zeros.status();
    buffer = std::move(*zeros);
    return absl::OkStatus();
  };
  // In place, as torch.distributed.all_reduce (the peer) is.
  ops.all_reduce = [&] { return pg.AllReduceInPlace(&buffer, dtrain::v1::REDUCE_OP_SUM); };
  ops.broadcast = [&]() -> absl::Status {
    auto got = pg.Broadcast(0, pg.rank() == 0 ? &buffer : nullptr);
    if (!got.ok()) return got.status();
    buffer = std::move(*got);
    return absl::OkStatus();
  };
  ops.all_gather = [&]() -> absl::Status { return pg.AllGather(buffer).status(); };
  ops.agree = [&](int value) -> absl::StatusOr<int> {
    std::string text = std::to_string(value);
    auto agreed = pg.BroadcastBytes(0, pg.rank() == 0 ? &text : nullptr);
    if (!agreed.ok()) return agreed.status();
    return std::stoi(*agreed);
  };
  return dtrain::bench::RunCollectivesBench(ops, dtrain::bench::PlanFromFlags());
}

// libFuzzer target: a training call's packed answer (common/packed_batch_results.h), which the
// coordinator reads from every worker. Bytes as a LocalResult: its packed results through
// `CheckPackedBatchResults`, and when they pass, every entry read as the coordinator reads it;
// its batches through `PackBatchResults`. A crash, a sanitizer report, an accepted answer whose
// reads would leave its fields, or a packing that its own check refuses or that loses a value is
// a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>

#include "common/packed_batch_results.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dtrain::v1::LocalResult result;
  if (!result.ParseFromArray(data, static_cast<int>(size))) return 0;
  constexpr int64_t kMost = 1024;
  const dtrain::v1::PackedBatchResults& p = result.packed();
  if (dtrain::CheckPackedBatchResults(p, kMost).ok()) {
    // The coordinator's reads (grpc_worker_group.cc): every index inside its field.
    const int names = p.scalar_names_size(), rates = p.rate_names_size();
    int stepped = 0;
    for (int b = 0; b < p.sizes_size(); ++b) {
      if (b >= kMost || b >= p.optimizer_stepped_size() || b >= p.step_skipped_size()) std::abort();
      for (int j = 0; j < names; ++j) {
        if (b * names + j >= p.scalar_values_size()) std::abort();
      }
      if (!p.optimizer_stepped(b)) continue;
      for (int j = 0; j < rates; ++j) {
        if (stepped * rates + j >= p.rate_values_size()) std::abort();
      }
      ++stepped;
    }
  }
  dtrain::v1::LocalResult packed = result;
  packed.clear_packed();
  const int batches = packed.batches_size();
  if (dtrain::PackBatchResults(&packed)) {
    const dtrain::v1::PackedBatchResults& q = packed.packed();
    if (!dtrain::CheckPackedBatchResults(q, batches).ok() || q.sizes_size() != batches ||
        packed.batches_size() != 0) {
      std::abort();
    }
    for (int b = 0; b < batches; ++b) {
      const dtrain::v1::BatchResult& original = result.batches(b);
      if (q.sizes(b) != original.size() || q.optimizer_stepped(b) != original.optimizer_stepped())
        std::abort();
    }
  }
  return 0;
}

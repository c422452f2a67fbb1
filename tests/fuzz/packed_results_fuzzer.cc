// libFuzzer target: a training call's packed answer (common/packed_batch_results.h), which the
// coordinator reads from every worker. Bytes as a LocalResult: through `CheckPackedBatchResults`
// as the answer to a call of up to 1024 batches from the one it names (and refused as another
// call's), and when it passes, every entry read as the coordinator reads it;
// its batches through `PackBatchResults`. A crash, a sanitizer report, an accepted answer whose
// reads would leave its fields, or a packing that its own check refuses or that loses a value is
// a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/packed_batch_results.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dtrain::v1::LocalResult result;
  if (!result.ParseFromArray(data, static_cast<int>(size))) return 0;
  constexpr int64_t kMost = 1024;
  const dtrain::v1::PackedBatchResults& p = result.packed();
  // Checked as the answer to a call from the batch it names, so that mutations of the first
  // batch still reach the shape checks; the same answer to another call must be refused.
  const int64_t first = p.first_batch_idx();
  if (dtrain::CheckPackedBatchResults(result, first, kMost).ok()) {
    if (result.batches_size() != 0 ||
        dtrain::CheckPackedBatchResults(result, first ^ 1, kMost).ok())
      std::abort();
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
    if (!dtrain::CheckPackedBatchResults(packed, q.first_batch_idx(), batches).ok() ||
        q.sizes_size() != batches || packed.batches_size() != 0 ||
        q.first_batch_idx() != result.batches(0).batch_idx()) {
      std::abort();
    }
    // Every value back where the batch had it (bit for bit: NaN included).
    auto same = [](double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    const int names = q.scalar_names_size(), rates = q.rate_names_size();
    int stepped = 0;
    for (int b = 0; b < batches; ++b) {
      const dtrain::v1::BatchResult& original = result.batches(b);
      if (q.sizes(b) != original.size() || q.optimizer_stepped(b) != original.optimizer_stepped() ||
          q.step_skipped(b) != original.step_skipped()) {
        std::abort();
      }
      for (int j = 0; j < names; ++j) {
        auto it = original.scalars().find(q.scalar_names(j));
        if (it == original.scalars().end() || !same(it->second, q.scalar_values(b * names + j)))
          std::abort();
      }
      if (!original.optimizer_stepped()) continue;
      for (int j = 0; j < rates; ++j) {
        auto it = original.learning_rates().find(q.rate_names(j));
        if (it == original.learning_rates().end() ||
            !same(it->second, q.rate_values(stepped * rates + j)))
          std::abort();
      }
      ++stepped;
    }
  }
  return 0;
}

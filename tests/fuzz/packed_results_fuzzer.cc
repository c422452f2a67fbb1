// libFuzzer target: a training call's packed answer (common/packed_batch_results.h), which the
// coordinator reads from every worker. Bytes as a LocalResult: through `CheckPackedBatchResults`
// as the answer to a call of up to 1024 batches from the one it names (and refused as another
// call's), and when it passes, every entry read through ForEachPackedBatch, the coordinator's
// own read;
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
    // The coordinator's reads (ForEachPackedBatch, as grpc_worker_group.cc calls it): every
    // value of every batch inside its field, and each value once.
    const int names = p.scalar_names_size(), rates = p.rate_names_size();
    const double* scalars = p.scalar_values().data();
    const double* rate_values = p.rate_values().data();
    int visited = 0, scalars_read = 0, rates_read = 0;
    double sum = 0;  // read every value, so that a read outside the field is a report
    dtrain::ForEachPackedBatch(p, [&](const dtrain::PackedBatch& batch) {
      if (visited >= kMost || batch.size != p.sizes(visited) ||
          batch.optimizer_stepped != p.optimizer_stepped(visited) ||
          batch.step_skipped != p.step_skipped(visited)) {
        std::abort();
      }
      if (names > 0) {
        if (batch.scalars != scalars + int64_t{visited} * names) std::abort();
        for (int j = 0; j < names; ++j) sum += batch.scalars[j];
        scalars_read += names;
      } else if (batch.scalars != nullptr) {
        std::abort();
      }
      if (batch.optimizer_stepped && rates > 0) {
        if (batch.rates != rate_values + rates_read) std::abort();
        for (int j = 0; j < rates; ++j) sum += batch.rates[j];
        rates_read += rates;
      } else if (batch.rates != nullptr) {
        std::abort();
      }
      ++visited;
    });
    if (visited != p.sizes_size() || scalars_read != p.scalar_values_size() ||
        rates_read != p.rate_values_size()) {
      std::abort();
    }
    volatile double keep = sum;
    (void)keep;
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

#include "common/packed_batch_results.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/map.h"

namespace dtrain {
namespace {

// The map's keys, sorted: a map's order is unspecified, the packed names' is fixed.
std::vector<std::string> SortedKeys(const google::protobuf::Map<std::string, double>& map) {
  std::vector<std::string> names;
  names.reserve(map.size());
  for (const auto& [name, value] : map) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

bool HasExactly(const google::protobuf::Map<std::string, double>& map,
                const std::vector<std::string>& names) {
  if (map.size() != names.size()) return false;
  for (const std::string& name : names) {
    if (map.find(name) == map.end()) return false;
  }
  return true;
}

}  // namespace

bool PackBatchResults(v1::LocalResult* result) {
  if (result->batches_size() == 0) return false;
  const std::vector<std::string> names = SortedKeys(result->batches(0).scalars());
  std::vector<std::string> rates;
  bool rates_known = false;
  int64_t expected_idx = result->batches(0).batch_idx();
  for (const v1::BatchResult& b : result->batches()) {
    if (b.batch_idx() != expected_idx++ || b.tensors_size() > 0 || b.kept_rows_size() > 0 ||
        b.logged_size() > 0 || !b.output_type().empty() || !HasExactly(b.scalars(), names)) {
      return false;
    }
    if (!b.optimizer_stepped()) {
      if (b.learning_rates_size() > 0) return false;
      continue;
    }
    if (!rates_known) {
      rates = SortedKeys(b.learning_rates());
      rates_known = true;
    }
    if (!HasExactly(b.learning_rates(), rates)) return false;
  }
  v1::PackedBatchResults& packed = *result->mutable_packed();
  packed.set_first_batch_idx(result->batches(0).batch_idx());
  const int n = result->batches_size();
  packed.mutable_sizes()->Reserve(n);
  packed.mutable_scalar_values()->Reserve(n * static_cast<int>(names.size()));
  packed.mutable_optimizer_stepped()->Reserve(n);
  packed.mutable_step_skipped()->Reserve(n);
  for (const std::string& name : names) packed.add_scalar_names(name);
  for (const std::string& name : rates) packed.add_rate_names(name);
  for (const v1::BatchResult& b : result->batches()) {
    packed.add_sizes(b.size());
    for (const std::string& name : names) packed.add_scalar_values(b.scalars().at(name));
    packed.add_optimizer_stepped(b.optimizer_stepped());
    packed.add_step_skipped(b.step_skipped());
    if (!b.optimizer_stepped()) continue;
    for (const std::string& name : rates) packed.add_rate_values(b.learning_rates().at(name));
  }
  result->clear_batches();
  return true;
}

absl::Status CheckPackedBatchResults(const v1::LocalResult& answer, int64_t first, int64_t count) {
  const v1::PackedBatchResults& packed = answer.packed();
  if (answer.batches_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed results come with ", answer.batches_size(), " BatchResults too"));
  }
  if (packed.first_batch_idx() != first) {
    return absl::InvalidArgumentError(absl::StrCat("packed results start at batch ",
                                                   packed.first_batch_idx(),
                                                   "; the call started at ", first));
  }
  const int64_t n = packed.sizes_size();
  if (n > count) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed results hold ", n, " batches; the call sent ", count));
  }
  const int64_t values = n * packed.scalar_names_size();
  if (packed.scalar_values_size() != values || packed.optimizer_stepped_size() != n ||
      packed.step_skipped_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed results of ", n, " batches and ", packed.scalar_names_size(),
                     " scalars carry ", packed.scalar_values_size(), " values (want ", values,
                     "), ", packed.optimizer_stepped_size(), " optimizer_stepped and ",
                     packed.step_skipped_size(), " step_skipped (want ", n, " each)"));
  }
  const int64_t stepped =
      std::count(packed.optimizer_stepped().begin(), packed.optimizer_stepped().end(), true);
  const int64_t rates = stepped * packed.rate_names_size();
  if (packed.rate_values_size() != rates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed results of ", stepped, " optimizer steps and ", packed.rate_names_size(),
        " learning rates carry ", packed.rate_values_size(), " rate values (want ", rates, ")"));
  }
  return absl::OkStatus();
}

void ForEachPackedBatch(const v1::PackedBatchResults& packed,
                        absl::FunctionRef<void(const PackedBatch&)> visit) {
  const int64_t names = packed.scalar_names_size();
  const int64_t rates = packed.rate_names_size();
  // Null rather than an offset into an empty field: a batch with no names reads nothing.
  const double* scalar_values = names > 0 ? packed.scalar_values().data() : nullptr;
  const double* rate_values = rates > 0 ? packed.rate_values().data() : nullptr;
  int64_t stepped = 0;
  for (int b = 0; b < packed.sizes_size(); ++b) {
    PackedBatch batch;
    batch.size = packed.sizes(b);
    batch.optimizer_stepped = packed.optimizer_stepped(b);
    batch.step_skipped = packed.step_skipped(b);
    if (scalar_values != nullptr) batch.scalars = scalar_values + b * names;
    if (batch.optimizer_stepped) {
      if (rate_values != nullptr) batch.rates = rate_values + stepped * rates;
      ++stepped;
    }
    visit(batch);
  }
}

}  // namespace dtrain

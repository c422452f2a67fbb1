#include "coordinator/jobs/batch_limits.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// One loop's limit: the oneof of its count and its fraction.
struct Limit {
  const char* key;
  bool has_count;
  int64_t count;
  bool has_fraction;
  double fraction;
};

Limit LimitOf(const v1::TrainerConfig& t, BatchLoop loop) {
  switch (loop) {
    case BatchLoop::kTrain:
      return {"limit_train_batches", t.has_limit_train_batches(), t.limit_train_batches(),
              t.has_limit_train_fraction(), t.limit_train_fraction()};
    case BatchLoop::kVal:
      return {"limit_val_batches", t.has_limit_val_batches(), t.limit_val_batches(),
              t.has_limit_val_fraction(), t.limit_val_fraction()};
    case BatchLoop::kTest:
      return {"limit_test_batches", t.has_limit_test_batches(), t.limit_test_batches(),
              t.has_limit_test_fraction(), t.limit_test_fraction()};
    case BatchLoop::kPredict:
      break;
  }
  return {"limit_predict_batches", t.has_limit_predict_batches(), t.limit_predict_batches(),
          t.has_limit_predict_fraction(), t.limit_predict_fraction()};
}

}  // namespace

std::string DescribeBatchLimit(const v1::TrainerConfig& trainer, BatchLoop loop) {
  const Limit l = LimitOf(trainer, loop);
  if (l.has_fraction) return absl::StrCat("trainer.", l.key, ": ", l.fraction);
  if (l.has_count) return absl::StrCat("trainer.", l.key, ": ", l.count);
  return absl::StrCat("trainer.", l.key, " unset");
}

bool BatchLoopOff(const v1::TrainerConfig& trainer, BatchLoop loop) {
  const Limit l = LimitOf(trainer, loop);
  return (l.has_count && l.count == 0) || (l.has_fraction && l.fraction == 0);
}

absl::StatusOr<int64_t> LimitBatches(const v1::TrainerConfig& trainer, BatchLoop loop,
                                     int64_t total) {
  const Limit l = LimitOf(trainer, loop);
  if (l.has_count) return std::min(total, l.count);
  if (!l.has_fraction || l.fraction >= 1.0) return total;
  const int64_t n = static_cast<int64_t>(std::floor(l.fraction * static_cast<double>(total)));
  if (n == 0 && l.fraction > 0 && total > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer.", l.key, ": ", l.fraction, " of ", total,
                     " batches per rank is less than one; give at least ",
                     1.0 / static_cast<double>(total), ", or a number of batches"));
  }
  return n;
}

absl::StatusOr<int64_t> LimitRankBatches(const v1::TrainerConfig& trainer, BatchLoop loop,
                                         RankBatches* batches, int64_t most) {
  int64_t longest = 0;
  for (const auto& mine : *batches) longest = std::max<int64_t>(longest, mine.size());
  absl::StatusOr<int64_t> keep = LimitBatches(trainer, loop, longest);
  if (!keep.ok()) return keep.status();
  if (most >= 0) *keep = std::min(*keep, most);
  for (auto& mine : *batches) {
    if (static_cast<int64_t>(mine.size()) > *keep) mine.resize(*keep);
  }
  return *keep;
}

}  // namespace dtrain

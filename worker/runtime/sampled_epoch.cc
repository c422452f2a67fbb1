#include "worker/runtime/sampled_epoch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/distributed_sampler.h"
#include "common/job_settings.h"

namespace dtrain {

absl::Status SampledEpoch::Deal(const v1::LocalWork& work, int64_t epoch,
                                const DealingRank& dealer) {
  if (work.batches_size() > 0 || work.index_batches_size() > 0 || !work.has_sampled()) {
    return absl::OkStatus();
  }
  const v1::SampledBatches& s = work.sampled();
  if (!s.deal().empty() && s.deal() != kSamplerDeal) {
    return absl::FailedPreconditionError(
        absl::StrCat("the call's batches are dealt by '", s.deal(), "'; this worker deals by '",
                     kSamplerDeal, "': send their indices (LocalWork.index_batches)"));
  }
  if (s.split() != "train") {
    return absl::InvalidArgumentError(absl::StrCat("sampled batches name split '", s.split(),
                                                   "'; the sampler deals only 'train'"));
  }
  if (s.samples() <= 0 || s.samples() > dealer.train_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampled batches deal ", s.samples(), " samples; this worker's train split has ",
        dealer.train_size, " (give 1 to ", dealer.train_size, ")"));
  }
  // The spec's bound (data.batch_size's option). A batch may hold more than the samples: it is
  // then the epoch's only batch, and a short one, as a listed call would send it.
  const int64_t most_batch = MostBatchRows();
  if (s.batch_size() <= 0 || s.batch_size() > most_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled batch_size is ", s.batch_size(), "; give 1 to ", most_batch));
  }
  if (s.batch_count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled batch_count is ", s.batch_count(), "; give at least 1"));
  }
  if (samples_ != s.samples() || shuffle_ != s.shuffle() || seed_ != s.seed() || epoch_ != epoch) {
    // Bounded by the dataset: at most ceil(split / world) indices.
    indices_ = TrainIndices(s.samples(), dealer.world, dealer.rank, dealer.streamed, s.shuffle(),
                            s.seed(), epoch);
    samples_ = s.samples();
    shuffle_ = s.shuffle();
    seed_ = s.seed();
    epoch_ = epoch;
  }
  const int64_t dealt = static_cast<int64_t>(indices_.size());
  const int64_t epoch_batches = dealt / s.batch_size() + (dealt % s.batch_size() != 0 ? 1 : 0);
  const int64_t first = work.first_batch_idx();
  if (first < 0 || first >= epoch_batches || s.batch_count() > epoch_batches - first) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled batches ", first, " to ", first, " + ", s.batch_count(),
                     " run past the epoch's ", epoch_batches, " batches of ", s.batch_size(),
                     " for rank ", dealer.rank, " of ", dealer.world));
  }
  return absl::OkStatus();
}

std::vector<int64_t> SampledEpoch::Batch(const v1::LocalWork& work, int i) const {
  // Deal checked that the batch starts before the dealt indices' end, so neither sum overflows.
  const int64_t size = work.sampled().batch_size();
  const int64_t begin = (work.first_batch_idx() + i) * size;
  const int64_t end =
      begin + std::min<int64_t>(size, static_cast<int64_t>(indices_.size()) - begin);
  return {indices_.begin() + begin, indices_.begin() + end};
}

}  // namespace dtrain

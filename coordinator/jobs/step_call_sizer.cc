#include "coordinator/jobs/step_call_sizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dtrain {

void StepCallSizer::Observe(int64_t batches, absl::Duration took, bool pipelined) {
  ++calls_;
  if (pipelined) ++pipelined_;
  largest_ = std::max(largest_, batches);
  if (fixed_ > 0 || batches <= 0) return;
  // A call cut short by a boundary (epoch end, validation) still measures the time per batch.
  const double per_batch = absl::ToDoubleSeconds(took) / static_cast<double>(batches);
  int64_t want = kMost;
  if (per_batch > 0) {
    want = static_cast<int64_t>(std::llround(absl::ToDoubleSeconds(kTarget) / per_batch));
  }
  const int64_t grown = std::max(next_, batches) * kGrowth;
  next_ = std::clamp<int64_t>(std::min(want, grown), 1, kMost);
}

int64_t StepCallSizer::Until(int64_t to_boundary) const {
  const int64_t next = Next();
  if (to_boundary <= next) return to_boundary;
  const int64_t rest = to_boundary - next;
  if (fixed_ == 0 && 2 * rest < next && to_boundary <= kMost) return to_boundary;
  return next;
}

std::string StepCallSizer::Summary() const {
  return absl::StrCat(calls_, " training calls (batches per call: ",
                      fixed_ > 0 ? absl::StrCat(fixed_) : absl::StrCat("auto, up to ", largest_),
                      ")", pipelined_ > 0 ? absl::StrCat(", ", pipelined_, " pipelined") : "");
}

}  // namespace dtrain

// Lightning's limit_{train,val,test,predict}_batches on one loop: how many of a rank's batches
// run. A limit is unset (all), a count (at most N), or a fraction (that share, rounded down),
// and fast_dev_run and overfit_batches have already been folded into them by NormalizeJobSpec.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/jobs/worker_group.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

enum class BatchLoop { kTrain, kVal, kTest, kPredict };

// The loop's limit in the spec's words, for messages: "trainer.limit_val_batches: 0.25".
std::string DescribeBatchLimit(const v1::TrainerConfig& trainer, BatchLoop loop);

// True when the loop is turned off: a limit of 0 (count or fraction).
bool BatchLoopOff(const v1::TrainerConfig& trainer, BatchLoop loop);

// The batches a rank runs out of its `total`. FAILED_PRECONDITION when a fraction above 0
// leaves none, as Lightning refuses it, naming the smallest fraction that gives one batch.
absl::StatusOr<int64_t> LimitBatches(const v1::TrainerConfig& trainer, BatchLoop loop,
                                     int64_t total);

// Every rank's evaluation batches cut to the loop's limit, a share taken of the longest rank's
// count (Lightning takes it of DistributedSampler's padded, equal shards; a shorter rank runs
// what it has), and to `most` when it is >= 0. The batches each rank keeps: the longest's.
absl::StatusOr<int64_t> LimitRankBatches(const v1::TrainerConfig& trainer, BatchLoop loop,
                                         RankBatches* batches, int64_t most = -1);

}  // namespace dtrain

// The order of a worker's training calls, for pipelined calls (StepRequest.pipelined): the
// coordinator sends a job's next training call before the last one answered, and gRPC may hand
// the two to their handlers in either order. Each training call has a place (where it starts
// and ends in its epoch); WorkerService holds a pipelined call until the call ending where it
// starts is queued, and runs it only right after that one succeeded
// (worker_service_training_order.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

// Where a training call of a job starts or ends (StepRequest.pipelined).
struct WorkerTrainPoint {
  std::string job;
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const WorkerTrainPoint& o) const {
    return job == o.job && epoch == o.epoch && batch == o.batch;
  }
  bool operator!=(const WorkerTrainPoint& o) const { return !(*this == o); }
};
// A training call's place in its job's order: where it ends, and for a pipelined one where
// the call it must follow ends.
struct WorkerTrainOrder {
  std::optional<WorkerTrainPoint> end;
  std::optional<WorkerTrainPoint> follows;
  // Touches nothing a training call reads or writes (a state dict read, another model's dry
  // run): a pipelined call still follows the training call before it.
  bool neutral = false;
};

// A training request's place: its end, and for a pipelined one the end it follows (the first
// local rank's batches: every rank's calls cover the same ones). INVALID_ARGUMENT for a
// pipelined request with nothing to order it by.
absl::StatusOr<WorkerTrainOrder> TrainOrderOf(const v1::StepRequest& request);

}  // namespace dtrain

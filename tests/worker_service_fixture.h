// The fixture of the worker daemon's end-to-end tests (worker_service_test.cc: one worker's
// life, its bad input and its leave; worker_service_strategies_test.cc: strategies against each
// other over each backend): real dtrain-worker processes driven through the Worker gRPC
// service, with a real coordinator for their groups.
#pragma once

#include <unistd.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/tensor.h"
#include "dtrain/v1/workers.grpc.pb.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"

// A named (inline) namespace, not an anonymous one: both files' tests are in the suites
// WorkerServiceTest and WorkerServiceBackendTest of one test executable, so they must share one
// fixture type.
namespace dtrain::testing {
inline namespace worker_service_fixture {

inline constexpr int kTrainSize = 1024;

inline v1::SetupRequest MakeSetup(const std::string& job, const std::string& strategy, int world,
                                  const std::string& coordinator,
                                  const std::string& backend = "grpc") {
  v1::SetupRequest r;
  r.mutable_spec()->mutable_trainer()->set_collective_backend(backend);
  r.set_job_id(job);
  r.mutable_spec()->mutable_model()->set_builtin("mlp");
  r.mutable_spec()->mutable_optimizer()->set_name("sgd");
  r.mutable_spec()->mutable_optimizer()->set_lr(0.1);
  r.mutable_spec()->mutable_optimizer()->set_momentum(0.9);
  r.mutable_spec()->mutable_trainer()->set_strategy(strategy);
  r.mutable_spec()->set_seed_everything(1);
  r.mutable_group()->set_coordinator(coordinator);
  r.mutable_group()->set_world_size(world);
  r.mutable_spec()->mutable_trainer()->set_collective_timeout_ms(20000);
  v1::SyntheticDataSpec* data = r.mutable_spec()->mutable_data()->mutable_synthetic();
  data->set_train_size(kTrainSize);
  data->set_val_size(256);
  data->set_test_size(256);
  data->set_seed(7);
  return r;
}

// Rank `rank` of `world` at step `step`: the rank's slice of the step's global batch of
// world * per_rank samples, so that ranks together see what one rank with the whole batch sees.
inline v1::LocalWork Slice(int step, int rank, int world, int per_rank, int steps = 1) {
  v1::LocalWork work;
  work.set_first_batch_idx(step);
  for (int s = step; s < step + steps; ++s) {
    v1::IndexBatch* b = work.add_index_batches();
    b->set_split("train");
    const int global = s * world * per_rank;
    for (int i = 0; i < per_rank; ++i) b->add_indices((global + rank * per_rank + i) % kTrainSize);
  }
  return work;
}

// Runs fn(i) for i in [0, n) on threads: Setup and collective steps block until every rank
// has called.
template <typename F>
inline void Parallel(int n, F fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

inline absl::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& rpc,
                         absl::Duration timeout = absl::Seconds(60)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return FromGrpcStatus(rpc(&context));
}

inline std::map<std::string, std::vector<float>> Parameters(WorkerProcess& w,
                                                            const std::string& job) {
  v1::StateDictRequest request;
  request.set_job_id(job);
  v1::StateDictResponse response;
  absl::Status s = Call([&](auto* c) { return w.stub().StateDict(c, request, &response); });
  EXPECT_TRUE(s.ok()) << s;
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, proto] : response.tensors()) {
    absl::StatusOr<HostTensor> t = FromProto(proto);
    EXPECT_TRUE(t.ok());
    if (t.ok() && t->dtype == v1::DTYPE_FLOAT32) out[name] = t->ToVector<float>();
  }
  return out;
}

inline double MaxDiff(const std::map<std::string, std::vector<float>>& a,
                      const std::map<std::string, std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  double worst = 0;
  for (const auto& [name, values] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != values.size()) return INFINITY;
    for (size_t i = 0; i < values.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(values[i]) - it->second[i]));
    }
  }
  return worst;
}

inline absl::StatusOr<v1::StepResponse> Train(WorkerProcess& w, const std::string& job,
                                              std::vector<v1::LocalWork> work) {
  v1::StepRequest request;
  request.set_job_id(job);
  for (v1::LocalWork& l : work) *request.add_work() = std::move(l);
  v1::StepResponse response;
  absl::Status s = Call([&](auto* c) { return w.stub().TrainingStep(c, request, &response); });
  if (!s.ok()) return s;
  return response;
}

inline absl::Status Teardown(WorkerProcess& w, const std::string& job = "") {
  v1::TeardownRequest request;
  request.set_job_id(job);
  v1::TeardownResponse response;
  return Call([&](auto* c) { return w.stub().Teardown(c, request, &response); });
}

inline v1::HealthResponse Health(WorkerProcess& w) {
  v1::HealthResponse response;
  absl::Status s = Call([&](auto* c) { return w.stub().Health(c, v1::HealthRequest(), &response); },
                        absl::Seconds(5));
  EXPECT_TRUE(s.ok()) << s;
  return response;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = StartCoordinator();
    ASSERT_NE(coordinator_, nullptr);
  }
  std::unique_ptr<WorkerProcess> StartWorker(std::vector<std::string> flags = {}) {
    auto w = WorkerProcess::Start(coordinator_->address(), std::move(flags));
    EXPECT_NE(w, nullptr);
    return w;
  }
  absl::Status Setup(WorkerProcess& w, const v1::SetupRequest& request,
                     v1::SetupResponse* response = nullptr) {
    v1::SetupResponse ignored;
    return Call(
        [&](auto* c) { return w.stub().Setup(c, request, response ? response : &ignored); });
  }
  std::string address() const { return coordinator_->address(); }
  // Whether the group `group` is forming with `members` registered: a Setup waits there.
  bool WaitForRegistered(const std::string& group, int members) {
    auto stub = v1::Coordinator::NewStub(ConnectToCoordinator(address()));
    return WaitFor(
        [&] {
          grpc::ClientContext context;
          v1::ListGroupsResponse groups;
          if (!stub->ListGroups(&context, v1::ListGroupsRequest(), &groups).ok()) return false;
          for (const v1::GroupInfo& g : groups.groups()) {
            if (g.group() == group && g.state() == v1::GROUP_STATE_FORMING &&
                g.members_size() == members) {
              return true;
            }
          }
          return false;
        },
        absl::Seconds(30));
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
};

// The distributed strategies, over each collective backend.
class WorkerServiceBackendTest : public WorkerServiceTest,
                                 public ::testing::WithParamInterface<std::string> {
 protected:
  v1::SetupRequest Distributed(const std::string& job, const std::string& strategy, int world) {
    return MakeSetup(job, strategy, world, address(), GetParam());
  }
};

}  // namespace worker_service_fixture
}  // namespace dtrain::testing

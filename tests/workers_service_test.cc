// The Workers service (coordinator/jobs/workers_service.h) over real gRPC on 127.0.0.1:0: the
// registry's calls round trip, bad input answers INVALID_ARGUMENT naming the field, every call
// needs the admin token (a job's token may not register or list workers), and the Coordinator
// service, which used to carry these calls, answers their old names UNIMPLEMENTED saying where
// they went.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "dtrain/v1/workers.grpc.pb.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace workers_service_test {

using ::testing::HasSubstr;

constexpr char kAdmin[] = "workers-admin-0123456789abcdef";

v1::WorkerInfo Worker(const std::string& name, uint64_t incarnation) {
  v1::WorkerInfo w;
  w.set_name(name);
  w.set_address("127.0.0.1:40001");
  w.set_host("host-" + name);
  w.set_devices(2);
  w.set_incarnation(incarnation);
  return w;
}

template <typename Call>
absl::Status Unary(Call call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return FromGrpcStatus(call(&context));
}

// A unary call by its full method name, as a client built from an older .proto makes it.
template <typename Request, typename Response>
absl::Status CallByName(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                        const Request& request) {
  grpc::TemplatedGenericStub<Request, Response> stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  Response response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // Bounded by the call's deadline.
  done.WaitForNotification();
  return FromGrpcStatus(status);
}

class WorkersServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options = FastOptions();
    options.admin_token = kAdmin;
    coordinator_ = StartCoordinator(options);
    ASSERT_NE(coordinator_, nullptr);
    admin_ = Stub(kAdmin);
  }

  std::unique_ptr<v1::Workers::Stub> Stub(const std::string& token) {
    return v1::Workers::NewStub(ConnectToCoordinator(coordinator_->address(), token));
  }

  absl::Status Register(v1::Workers::Stub& stub, const v1::WorkerInfo& worker,
                        v1::RegisterWorkerResponse* response = nullptr) {
    v1::RegisterWorkerRequest request;
    *request.mutable_worker() = worker;
    v1::RegisterWorkerResponse ignored;
    return Unary([&](grpc::ClientContext* c) {
      return stub.RegisterWorker(c, request, response != nullptr ? response : &ignored);
    });
  }

  absl::Status Heartbeat(v1::Workers::Stub& stub, const std::string& name, uint64_t incarnation,
                         const std::string& job_id = "",
                         v1::WorkerHeartbeatResponse* response = nullptr) {
    v1::WorkerHeartbeatRequest request;
    request.set_name(name);
    request.set_incarnation(incarnation);
    request.set_job_id(job_id);
    v1::WorkerHeartbeatResponse ignored;
    return Unary([&](grpc::ClientContext* c) {
      return stub.WorkerHeartbeat(c, request, response != nullptr ? response : &ignored);
    });
  }

  absl::Status Unregister(v1::Workers::Stub& stub, const std::string& name, uint64_t incarnation) {
    v1::UnregisterWorkerRequest request;
    request.set_name(name);
    request.set_incarnation(incarnation);
    v1::UnregisterWorkerResponse response;
    return Unary(
        [&](grpc::ClientContext* c) { return stub.UnregisterWorker(c, request, &response); });
  }

  absl::StatusOr<std::vector<v1::WorkerInfo>> List(v1::Workers::Stub& stub) {
    v1::ListWorkersResponse response;
    absl::Status status = Unary([&](grpc::ClientContext* c) {
      return stub.ListWorkers(c, v1::ListWorkersRequest(), &response);
    });
    if (!status.ok()) return status;
    return std::vector<v1::WorkerInfo>(response.workers().begin(), response.workers().end());
  }

  // The names the admin sees listed.
  std::vector<std::string> Listed() {
    std::vector<std::string> names;
    auto workers = List(*admin_);
    EXPECT_TRUE(workers.ok()) << workers.status();
    if (workers.ok()) {
      for (const v1::WorkerInfo& w : *workers) names.push_back(w.name());
    }
    return names;
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::unique_ptr<v1::Workers::Stub> admin_;
};

TEST_F(WorkersServiceTest, RegisterHeartbeatListUnregister_RoundTrip) {
  v1::WorkerInfo w = Worker("w1", 0x1234);
  v1::Plugin* plugin = w.add_plugins();
  plugin->set_kind("strategy");
  plugin->set_name("my-ddp");
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(Register(*admin_, w, &registered).ok());
  // FastOptions: a 100 ms interval and a 2 s timeout, well under the heartbeat budget.
  EXPECT_EQ(registered.heartbeat_interval_ms(), 100);
  EXPECT_EQ(registered.heartbeat_timeout_ms(), 2000);

  auto listed = List(*admin_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  const v1::WorkerInfo& info = listed->front();
  EXPECT_EQ(info.name(), "w1");
  EXPECT_EQ(info.address(), "127.0.0.1:40001");
  EXPECT_EQ(info.host(), "host-w1");
  EXPECT_EQ(info.devices(), 2);
  EXPECT_EQ(info.incarnation(), 0x1234u);
  EXPECT_EQ(info.state(), v1::WorkerInfo::ALIVE);
  EXPECT_GT(info.registered_unix_ms(), 0);
  ASSERT_EQ(info.plugins_size(), 1);
  EXPECT_EQ(info.plugins(0).name(), "my-ddp");
  EXPECT_TRUE(info.job_id().empty());

  v1::WorkerHeartbeatResponse beat;
  ASSERT_TRUE(Heartbeat(*admin_, "w1", 0x1234, "job-7", &beat).ok());
  EXPECT_EQ(beat.heartbeat_interval_ms(), 100);
  EXPECT_EQ(beat.heartbeat_timeout_ms(), 2000);
  EXPECT_TRUE(beat.abandoned_job().empty());
  EXPECT_FALSE(beat.release_pending());
  listed = List(*admin_);
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  EXPECT_EQ(listed->front().job_id(), "job-7");

  EXPECT_TRUE(Unregister(*admin_, "w1", 0x1234).ok());
  EXPECT_TRUE(Listed().empty());
  // Idempotent: a goodbye said twice (or by a worker already forgotten) is fine.
  EXPECT_TRUE(Unregister(*admin_, "w1", 0x1234).ok());
}

TEST_F(WorkersServiceTest, AnotherIncarnation_NotFound_UntilItRegisters) {
  ASSERT_TRUE(Register(*admin_, Worker("w1", 7)).ok());
  absl::Status stale = Heartbeat(*admin_, "w1", 8);
  EXPECT_EQ(stale.code(), absl::StatusCode::kNotFound) << stale;
  EXPECT_THAT(stale.message(), HasSubstr("worker 'w1' (this incarnation) is not registered; "
                                         "register again"));
  absl::Status unknown = Heartbeat(*admin_, "nobody", 1);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  absl::Status other = Unregister(*admin_, "w1", 8);
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound) << other;
  EXPECT_THAT(other.message(), HasSubstr("'w1' is registered by another incarnation"));
  EXPECT_EQ(Listed(), std::vector<std::string>{"w1"});

  // The restarted process registers and replaces the old one.
  ASSERT_TRUE(Register(*admin_, Worker("w1", 8)).ok());
  EXPECT_TRUE(Heartbeat(*admin_, "w1", 8).ok());
  EXPECT_EQ(Heartbeat(*admin_, "w1", 7).code(), absl::StatusCode::kNotFound);
  auto listed = List(*admin_);
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  EXPECT_EQ(listed->front().incarnation(), 8u);
}

TEST_F(WorkersServiceTest, BadInput_InvalidArgumentNamingTheField) {
  struct Case {
    std::function<void(v1::WorkerInfo*)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::WorkerInfo* w) { w->clear_name(); }, "worker name is empty"},
      {[](v1::WorkerInfo* w) { w->set_name(std::string(257, 'n')); },
       "worker name is 257 bytes; at most 256"},
      {[](v1::WorkerInfo* w) { w->clear_address(); }, "worker address is empty"},
      {[](v1::WorkerInfo* w) { w->clear_host(); }, "worker host is empty"},
      {[](v1::WorkerInfo* w) { w->set_devices(0); }, "worker devices must be at least 1, got 0"},
      {[](v1::WorkerInfo* w) { w->set_incarnation(0); },
       "worker incarnation must be a non-zero random id"},
      {[](v1::WorkerInfo* w) {
         v1::Plugin* p = w->add_plugins();
         p->set_kind("optimizer");
         p->set_name("adam2");
       },
       "plugin 'adam2' has kind 'optimizer'; use accelerator, precision, strategy, checkpoint_io"},
      {[](v1::WorkerInfo* w) {
         v1::Plugin* p = w->add_plugins();
         p->set_kind("strategy");
         p->set_name("Bad Name");
       },
       "plugin name 'Bad Name' must be 1 to 64 characters"},
      {[](v1::WorkerInfo* w) {
         for (int i = 0; i < 257; ++i) {
           v1::Plugin* p = w->add_plugins();
           p->set_kind("strategy");
           p->set_name(absl::StrCat("s", i));
         }
       },
       "a worker offers at most 256 plugins, got 257"},
      {[](v1::WorkerInfo* w) {
         v1::Plugin* p = w->add_plugins();
         p->set_kind("strategy");
         p->set_name("wordy");
         p->set_description(std::string(1025, 'd'));
       },
       "plugin 'wordy' has a description of 1025 bytes; at most 1024"},
  };
  for (const Case& c : cases) {
    v1::WorkerInfo w = Worker("bad", 5);
    c.change(&w);
    absl::Status s = Register(*admin_, w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(Listed().empty()) << "a refused registration was kept";

  // Heartbeats and goodbyes carry the identity a registration was accepted with.
  ASSERT_TRUE(Register(*admin_, Worker("good", 5)).ok());
  const absl::Status long_job = Heartbeat(*admin_, "good", 5, std::string(257, 'j'));
  EXPECT_EQ(long_job.code(), absl::StatusCode::kInvalidArgument) << long_job;
  EXPECT_THAT(long_job.message(), HasSubstr("heartbeat job_id is 257 bytes"));
  for (const auto& [name, incarnation, message] :
       std::vector<std::tuple<std::string, uint64_t, std::string>>{
           {"", 5, "worker name is empty"},
           {"good", 0,
            "worker 'good': incarnation must be the non-zero random id it registered "
            "with"}}) {
    absl::Status beat = Heartbeat(*admin_, name, incarnation);
    EXPECT_EQ(beat.code(), absl::StatusCode::kInvalidArgument) << beat;
    EXPECT_THAT(beat.message(), HasSubstr(message));
    absl::Status bye = Unregister(*admin_, name, incarnation);
    EXPECT_EQ(bye.code(), absl::StatusCode::kInvalidArgument) << bye;
    EXPECT_THAT(bye.message(), HasSubstr(message));
  }
  // The service kept serving, and the good worker is untouched.
  EXPECT_TRUE(Heartbeat(*admin_, "good", 5).ok());
  EXPECT_EQ(Listed(), std::vector<std::string>{"good"});
}

TEST_F(WorkersServiceTest, EveryCallNeedsTheAdminToken_AJobTokenMayNotPoseAsAWorker) {
  ASSERT_TRUE(Register(*admin_, Worker("w1", 3)).ok());
  const std::string job_token = coordinator_->access().IssueJobToken("job-a");
  ASSERT_FALSE(job_token.empty());
  struct Caller {
    std::string token;
    absl::StatusCode code;
    std::string message;  // for RegisterWorker; the others name their own call
  };
  for (const Caller& caller : std::vector<Caller>{
           {"", absl::StatusCode::kUnauthenticated, "requires a bearer token"},
           {"not-the-token", absl::StatusCode::kUnauthenticated, "not valid on this coordinator"},
           {job_token, absl::StatusCode::kPermissionDenied,
            "RegisterWorker refused: the token presented was issued for job group 'job-a' and is "
            "valid only for that group's calls; RegisterWorker needs the cluster's admin token"},
       }) {
    auto stub = Stub(caller.token);
    absl::Status reg = Register(*stub, Worker("intruder", 9));
    EXPECT_EQ(reg.code(), caller.code) << reg;
    EXPECT_THAT(reg.message(), HasSubstr(caller.message));
    absl::Status beat = Heartbeat(*stub, "w1", 3);
    EXPECT_EQ(beat.code(), caller.code) << beat;
    absl::Status bye = Unregister(*stub, "w1", 3);
    EXPECT_EQ(bye.code(), caller.code) << bye;
    auto list = List(*stub);
    EXPECT_EQ(list.status().code(), caller.code) << list.status();
    if (caller.code == absl::StatusCode::kPermissionDenied) {
      EXPECT_THAT(beat.message(), HasSubstr("WorkerHeartbeat needs the cluster's admin token"));
      EXPECT_THAT(bye.message(), HasSubstr("UnregisterWorker needs the cluster's admin token"));
      EXPECT_THAT(list.status().message(),
                  HasSubstr("ListWorkers needs the cluster's admin token"));
    }
  }
  // Nothing the refused calls asked for happened: no intruder, and w1 neither gone nor beating.
  auto listed = List(*admin_);
  ASSERT_TRUE(listed.ok() && listed->size() == 1u) << listed.status();
  EXPECT_EQ(listed->front().name(), "w1");
  EXPECT_EQ(listed->front().incarnation(), 3u);
}

TEST_F(WorkersServiceTest, CoordinatorService_OldWorkerRpcNames_UnimplementedNamingTheirNewHome) {
  auto channel = ConnectToCoordinator(coordinator_->address(), kAdmin);
  v1::RegisterWorkerRequest registration;
  *registration.mutable_worker() = Worker("old-client", 4);
  absl::Status reg = CallByName<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
      channel, "/dtrain.v1.Coordinator/RegisterWorker", registration);
  EXPECT_EQ(reg.code(), absl::StatusCode::kUnimplemented) << reg;
  EXPECT_THAT(reg.message(),
              HasSubstr("/dtrain.v1.Coordinator/RegisterWorker moved to "
                        "/dtrain.v1.Workers/RegisterWorker (same messages, same port)"));
  EXPECT_TRUE(Listed().empty()) << "the old name registered the worker";
  for (const std::string method : {"WorkerHeartbeat", "UnregisterWorker", "ListWorkers"}) {
    // An empty message is a valid encoding of each request.
    absl::Status s = CallByName<v1::ListWorkersRequest, v1::ListWorkersResponse>(
        channel, "/dtrain.v1.Coordinator/" + method, v1::ListWorkersRequest());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << method << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("moved to /dtrain.v1.Workers/" + method)) << method;
  }
  absl::Status unknown = CallByName<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      channel, "/dtrain.v1.Coordinator/NoSuchMethod", v1::ListWorkersRequest());
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnimplemented) << unknown;
  EXPECT_THAT(unknown.message(),
              HasSubstr("this server has no method /dtrain.v1.Coordinator/NoSuchMethod"));
  // The new names, on the same channel, work.
  absl::Status moved = CallByName<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
      channel, "/dtrain.v1.Workers/RegisterWorker", registration);
  EXPECT_TRUE(moved.ok()) << moved;
  EXPECT_EQ(Listed(), std::vector<std::string>{"old-client"});
}

// ListWorkers pages by name: each page resumes after the last name of the one before, so a
// worker present throughout is listed once while others register and leave between pages.
TEST_F(WorkersServiceTest, ListWorkers_PagesByName_ResumingAfterTheLastOneListed) {
  for (const char* name : {"w1", "w2", "w3", "w4", "w5"}) {
    ASSERT_TRUE(Register(*admin_, Worker(name, 9)).ok()) << name;
  }
  auto page = [&](const std::string& token, v1::ListWorkersResponse* response) {
    v1::ListWorkersRequest request;
    request.set_page_size(2);
    request.set_page_token(token);
    return Unary([&](grpc::ClientContext* c) { return admin_->ListWorkers(c, request, response); });
  };
  auto names = [](const v1::ListWorkersResponse& r) {
    std::vector<std::string> out;
    for (const v1::WorkerInfo& w : r.workers()) out.push_back(w.name());
    return out;
  };
  v1::ListWorkersResponse first, second, third;
  ASSERT_TRUE(page("", &first).ok());
  EXPECT_EQ(names(first), (std::vector<std::string>{"w1", "w2"}));
  ASSERT_FALSE(first.next_page_token().empty());
  // Between pages: one listed leaves, one sorts before the token, one after it.
  ASSERT_TRUE(Unregister(*admin_, "w1", 9).ok());
  ASSERT_TRUE(Register(*admin_, Worker("w0", 9)).ok());
  ASSERT_TRUE(Register(*admin_, Worker("w35", 9)).ok());
  ASSERT_TRUE(page(first.next_page_token(), &second).ok());
  EXPECT_EQ(names(second), (std::vector<std::string>{"w3", "w35"}));
  ASSERT_TRUE(page(second.next_page_token(), &third).ok());
  EXPECT_EQ(names(third), (std::vector<std::string>{"w4", "w5"}));
  EXPECT_EQ(third.next_page_token(), "") << "the last page";

  // Every worker in one page of page_size 0: they fit one answer.
  EXPECT_EQ(Listed(), (std::vector<std::string>{"w0", "w2", "w3", "w35", "w4", "w5"}));

  v1::ListWorkersResponse refused;
  v1::ListWorkersRequest negative;
  negative.set_page_size(-3);
  absl::Status s =
      Unary([&](grpc::ClientContext* c) { return admin_->ListWorkers(c, negative, &refused); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("page_size must be >= 0 (0: as many as fit), got -3"));
  s = page("w1!", &refused);  // no token this service gives
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("page_token (3 bytes) is not one this service gave"));
}

}  // namespace workers_service_test
}  // namespace dtrain::testing

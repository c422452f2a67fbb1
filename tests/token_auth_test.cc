// Bearer-token authentication: the admin token on every RPC of the coordinator and the workers,
// and job tokens that work only inside their own job's group. In-process coordinator for the
// scoping rules (every kind of call: join, heartbeat, unary and streamed collectives, session,
// key-value, control plane); real processes and the CLI for the cluster end to end, where the
// tokens must also never reach a log.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/kv_client.h"
#include "common/bearer_token.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "dtrain/v1/workers.grpc.pb.h"
#include "tests/local_cluster.h"
#include "tests/worker_process.h"

namespace dtrain::testing {
namespace token_auth_test {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-secret-0123456789abcdef";

class TokenScopeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options = FastOptions();
    options.admin_token = kAdmin;
    coordinator_ = StartCoordinator(options);
    ASSERT_NE(coordinator_, nullptr);
    token_a_ = coordinator_->access().IssueJobToken("job-a");
    token_b_ = coordinator_->access().IssueJobToken("job-b");
    ASSERT_EQ(token_a_.size(), 64u);
    ASSERT_NE(token_a_, token_b_);
  }

  std::unique_ptr<v1::Coordinator::Stub> Stub(const std::string& token) {
    return v1::Coordinator::NewStub(ConnectToCoordinator(coordinator_->address(), token));
  }

  absl::StatusOr<std::unique_ptr<ProcessGroup>> Join(const std::string& group,
                                                     const std::string& token) {
    ProcessGroupOptions options = GroupOptions(group, 1, "h");
    options.token = token;
    options.register_timeout = absl::Seconds(5);
    return ProcessGroup::Join(coordinator_->address(), options);
  }

  // One AllReduce stream of a 1-element float tensor as `member`, with `token`.
  absl::Status AllReduceAs(const std::string& token, const v1::MemberRef& member,
                           int64_t sequence) {
    auto stub = Stub(token);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->AllReduce(&context);
    v1::AllReduceRequest request;
    v1::AllReduceHeader* header = request.mutable_header();
    *header->mutable_context()->mutable_member() = member;
    header->mutable_context()->set_sequence(sequence);
    header->set_op(v1::REDUCE_OP_SUM);
    header->mutable_meta()->set_dtype(v1::DTYPE_FLOAT32);
    header->mutable_meta()->add_shape(1);
    const float one = 1.0f;
    request.set_chunk(std::string(reinterpret_cast<const char*>(&one), sizeof(one)));
    stream->Write(request);
    stream->WritesDone();
    v1::AllReduceResponse response;
    while (stream->Read(&response)) {
    }
    return FromGrpcStatus(stream->Finish());
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::string token_a_, token_b_;
};

TEST_F(TokenScopeTest, JobTokenWorksInItsGroupOnly) {
  auto a = Join("job-a", token_a_);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Join("job-b", token_b_);
  ASSERT_TRUE(b.ok()) << b.status();
  // In its own group every kind of call works.
  auto sum = (*a)->AllReduce(HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {2}, {1.5f, 2.0f}),
                             v1::REDUCE_OP_SUM);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->ToVector<float>(), (std::vector<float>{1.5f, 2.0f}));
  EXPECT_TRUE((*a)->Barrier("in-a").ok());
  EXPECT_TRUE((*a)->store().Set("k", "v").ok());

  // Joining job B with job A's token.
  auto intruder = Join("job-b", token_a_);
  ASSERT_EQ(intruder.status().code(), absl::StatusCode::kPermissionDenied) << intruder.status();
  EXPECT_THAT(intruder.status().message(),
              HasSubstr("register in group 'job-b' refused: the token presented was issued for "
                        "job group 'job-a'"));

  // Job B's key-value scope, read and written with job A's token.
  KeyValueClient kv(ConnectToCoordinator(coordinator_->address(), token_a_), "job-b");
  ASSERT_TRUE((*b)->store().Set("secret", "b-only").ok());
  absl::StatusOr<std::string> read = kv.Get("secret", absl::Seconds(1));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kPermissionDenied) << read.status();
  EXPECT_EQ(kv.Set("secret", "overwritten").code(), absl::StatusCode::kPermissionDenied);
  auto still = (*b)->store().Get("secret", absl::Seconds(1));
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(*still, "b-only");

  // A collective, a barrier and a heartbeat in B as B's member, with A's token: each refused
  // before it reaches the group, so B's sequence and health are untouched.
  const v1::MemberRef b_member = (*b)->assignment().member();
  absl::Status streamed = AllReduceAs(token_a_, b_member, 0);
  EXPECT_EQ(streamed.code(), absl::StatusCode::kPermissionDenied) << streamed;
  EXPECT_THAT(streamed.message(), HasSubstr("all_reduce in group 'job-b' refused"));
  {
    v1::BarrierRequest request;
    *request.mutable_context()->mutable_member() = b_member;
    request.mutable_context()->set_sequence(0);
    v1::BarrierResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    absl::Status barrier = FromGrpcStatus(Stub(token_a_)->Barrier(&context, request, &response));
    EXPECT_EQ(barrier.code(), absl::StatusCode::kPermissionDenied) << barrier;
  }
  {
    v1::HeartbeatRequest request;
    *request.mutable_member() = b_member;
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    absl::Status hb = FromGrpcStatus(Stub(token_a_)->Heartbeat(&context, request, &response));
    EXPECT_EQ(hb.code(), absl::StatusCode::kPermissionDenied) << hb;
  }
  {
    grpc::ClientContext context;
    auto session = Stub(token_a_)->Session(&context);
    v1::SessionRequest request;
    *request.mutable_barrier()->mutable_context()->mutable_member() = b_member;
    session->Write(request);
    session->WritesDone();
    v1::SessionResponse response;
    EXPECT_FALSE(session->Read(&response));
    absl::Status s = FromGrpcStatus(session->Finish());
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(s.message(), HasSubstr("barrier in group 'job-b' refused"));
  }
  auto b_sum = (*b)->AllReduce(HostTensor::FromVector<float>(v1::DTYPE_FLOAT32, {1}, {4.0f}),
                               v1::REDUCE_OP_SUM);
  ASSERT_TRUE(b_sum.ok()) << b_sum.status();
  EXPECT_EQ(b_sum->ToVector<float>(), (std::vector<float>{4.0f}));
  EXPECT_TRUE((*b)->health().ok()) << (*b)->health();

  // The control plane needs the admin token.
  {
    auto workers = v1::Workers::NewStub(ConnectToCoordinator(coordinator_->address(), token_a_));
    v1::ListWorkersResponse response;
    grpc::ClientContext context;
    absl::Status s = FromGrpcStatus(workers->ListWorkers(&context, {}, &response));
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(s.message(), HasSubstr("ListWorkers needs the cluster's admin token"));
  }
  {
    auto jobs = v1::Jobs::NewStub(ConnectToCoordinator(coordinator_->address(), token_a_));
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    absl::Status s = FromGrpcStatus(jobs->ListJobs(&context, {}, &response));
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  {
    v1::ListGroupsResponse response;
    grpc::ClientContext context;
    absl::Status s = FromGrpcStatus(Stub(kAdmin)->ListGroups(&context, {}, &response));
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(response.groups_size(), 2);
  }
}

TEST_F(TokenScopeTest, MissingWrongAndRevokedTokensAreUnauthenticated) {
  for (const std::string& token : {std::string(), std::string("not-the-token")}) {
    auto pg = Join("job-a", token);
    ASSERT_EQ(pg.status().code(), absl::StatusCode::kUnauthenticated) << token << pg.status();
    EXPECT_THAT(pg.status().message(),
                HasSubstr(token.empty() ? "requires a bearer token: give --token, --token_file "
                                          "or set DTRAIN_TOKEN"
                                        : "not valid on this coordinator"));
    absl::Status streamed = AllReduceAs(token, v1::MemberRef(), 0);
    EXPECT_EQ(streamed.code(), absl::StatusCode::kUnauthenticated) << streamed;
  }
  // A malformed header is named as such.
  {
    auto stub = Stub("");
    v1::ListGroupsResponse response;
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Basic ") + kAdmin);
    absl::Status s = FromGrpcStatus(stub->ListGroups(&context, {}, &response));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(s.message(), HasSubstr("not of the form 'Bearer <token>'"));
  }
  // A member whose job ended: its token stops working at once.
  auto a = Join("job-a", token_a_);
  ASSERT_TRUE(a.ok()) << a.status();
  coordinator_->access().RevokeJobToken(token_a_);
  absl::Status after = (*a)->Barrier("after-revoke");
  EXPECT_EQ(after.code(), absl::StatusCode::kUnauthenticated) << after;
  EXPECT_THAT(after.message(), HasSubstr("the token of a job that has ended"));
  EXPECT_EQ(coordinator_->access().job_tokens(), 1u);
}

TEST(BearerTokenTest, ComparisonAndValidation) {
  EXPECT_TRUE(SameToken("abc", "abc"));
  EXPECT_FALSE(SameToken("abc", "abd"));
  EXPECT_FALSE(SameToken("abc", "abcd"));
  EXPECT_FALSE(SameToken("", "a"));
  const std::string t1 = NewRandomToken(), t2 = NewRandomToken();
  EXPECT_EQ(t1.size(), 64u);
  EXPECT_NE(t1, t2);
  EXPECT_TRUE(std::regex_match(t1, std::regex("[0-9a-f]{64}")));
  EXPECT_TRUE(ValidateToken("s3cr3t-token_~", "--token").ok());
  absl::Status spaced = ValidateToken("two words", "--token_file 'f'");
  EXPECT_EQ(spaced.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spaced.message(), HasSubstr("--token_file 'f' holds a character"));
  EXPECT_EQ(ValidateToken("", "DTRAIN_TOKEN").code(), absl::StatusCode::kInvalidArgument);
}

// The cluster end to end: a coordinator and a worker that require the admin token, the CLI
// with and without it, a ddp_spawn job (whose children get the job's token, never the
// worker's), and logs that hold no token.
class TokenClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ =
        std::make_unique<LocalCluster>(absl::StrCat(::testing::TempDir(), "/token-e2e-", getpid()));
    std::ofstream(cluster_->dir() + "/token") << kAdmin << "\n";
  }
  void TearDown() override { SetClientToken(""); }

  CommandResult Cli(const std::string& env, const std::string& args) {
    return cluster_->Dtrain("--timeout=5s " + args, env);
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(TokenClusterTest, AdminTokenRequired_JobRuns_NoTokenInLogs) {
  const std::string& dir = cluster_->dir();
  // This process calls the coordinator and the worker too (LocalCluster's stubs, WorkerProcess
  // checking that it serves): with the admin token.
  SetClientToken(kAdmin);
  // The coordinator's and the worker's own logs (stderr, the ddp_spawn children's included),
  // at debug level, go to files, to be searched for tokens.
  ASSERT_TRUE(cluster_->StartCoordinator(
      "127.0.0.1:0", {"--token_file=" + dir + "/token", "--log_level=debug"},
      {"/bin/sh", "-c", absl::StrCat("exec \"$@\" 2> ", dir, "/coordinator.log"), "sh"}));
  ASSERT_TRUE(cluster_->AddWorker(
      "tok-w0", {"--token_file=" + dir + "/token", "--log_level=debug"},
      {"/bin/sh", "-c", absl::StrCat("exec \"$@\" 2> ", dir, "/worker.log"), "sh"}));
  {
    // The worker refuses callers without its token.
    auto anonymous = v1::Worker::NewStub(
        ConnectToCoordinator(absl::StrCat("127.0.0.1:", cluster_->worker("tok-w0").port()), ""));
    grpc::ClientContext context;
    v1::HealthResponse health;
    absl::Status s = FromGrpcStatus(anonymous->Health(&context, {}, &health));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_TRUE(health.worker_name().empty());
    grpc::ClientContext teardown_context;
    v1::TeardownResponse torn;
    EXPECT_EQ(FromGrpcStatus(anonymous->Teardown(&teardown_context, {}, &torn)).code(),
              absl::StatusCode::kUnauthenticated);
  }
  const std::string with_token = absl::StrCat("DTRAIN_TOKEN=", kAdmin);
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 1; }, absl::Seconds(15)));
  EXPECT_THAT(Cli(with_token, "workers").output, HasSubstr("tok-w0"));

  CommandResult anonymous = Cli("DTRAIN_TOKEN=", "list");
  EXPECT_EQ(anonymous.exit_code, 3) << anonymous.output;
  EXPECT_THAT(anonymous.output, HasSubstr("UNAUTHENTICATED: this service requires a bearer token"));
  CommandResult wrong = Cli("DTRAIN_TOKEN=guess", "list");
  EXPECT_EQ(wrong.exit_code, 3) << wrong.output;
  EXPECT_THAT(wrong.output, HasSubstr("not valid on this coordinator"));
  CommandResult spaced = Cli("", "--token='a b' list");
  EXPECT_EQ(spaced.exit_code, 2) << spaced.output;

  const std::string job = cluster_->WriteSpec("job", R"(name: tok
model: {builtin: mlp}
data:
  synthetic: {train_size: 256, val_size: 64, test_size: 64, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: ddp_spawn, devices: 2, num_nodes: 1}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05}
)");
  CommandResult submitted = Cli(with_token, "fit --wait --config " + job);
  EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
  EXPECT_THAT(submitted.output, HasSubstr("SUCCEEDED"));
  CommandResult by_flag = Cli("", absl::StrCat("--token=", kAdmin, " list"));
  EXPECT_EQ(by_flag.exit_code, 0) << by_flag.output;
  EXPECT_THAT(by_flag.output, HasSubstr("tok-1"));
  // What a user reads of the job: its log through the CLI, and its status.
  CommandResult job_log = Cli(with_token, "logs tok-1");
  ASSERT_EQ(job_log.exit_code, 0) << job_log.output;
  CommandResult job_status = Cli(with_token, "status tok-1 --output json");
  ASSERT_EQ(job_status.exit_code, 0) << job_status.output;

  ASSERT_TRUE(cluster_->Shutdown()) << "the coordinator did not stop on SIGTERM";
  // Neither the admin token nor any job token (NewRandomToken's 64 hex digits, as tested above)
  // is in any log: the daemons' (the worker's ddp_spawn children write to the same stderr),
  // the job's files, and what the CLI shows.
  const std::string worker_log = ReadFile(dir + "/worker.log");
  ASSERT_THAT(worker_log, HasSubstr("serving (ddp_spawn child)")) << "children's stderr missing";
  // The job's own lines (its ranks, in the children) are in it: the check below reads them.
  ASSERT_THAT(worker_log, HasSubstr("gradient sync")) << "the worker's log says nothing of the job";
  std::string logs =
      ReadFile(dir + "/coordinator.log") + worker_log + job_log.output + job_status.output;
  ASSERT_THAT(logs, HasSubstr("dtrain-coordinator: serving")) << "its stderr was not captured";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir + "/state")) {
    // Stored files (checkpoints) are named by their digest and hold tensors, not logs.
    if (entry.is_regular_file() &&
        entry.path().string().find("/state/artifacts/") == std::string::npos)
      logs += ReadFile(entry.path());
  }
  ASSERT_THAT(logs, HasSubstr("group formed"));
  EXPECT_THAT(logs, Not(HasSubstr(kAdmin)));
  // Files' digests ("sha256:" and 64 hex digits) are public names; a token is not.
  logs = std::regex_replace(logs, std::regex("sha256:[0-9a-f]{64}"), "sha256:...");
  EXPECT_FALSE(std::regex_search(logs, std::regex("[0-9a-f]{64}")));
}

// A gRPC endpoint that answers every call UNIMPLEMENTED and records the authorization header
// each call carried: where a Setup would like a worker's ranks to connect.
class Decoy : public grpc::CallbackGenericService {
 public:
  Decoy() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~Decoy() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<std::string> headers() {
    absl::MutexLock lock(&mu_);
    return headers_;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    {
      absl::MutexLock lock(&mu_);
      auto it = context->client_metadata().find("authorization");
      headers_.push_back(it == context->client_metadata().end()
                             ? "(none)"
                             : std::string(it->second.data(), it->second.size()));
    }
    class Refuse : public grpc::ServerGenericBidiReactor {
     public:
      Refuse() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "a decoy")); }
      void OnDone() override { delete this; }
    };
    return new Refuse();
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<std::string> headers_ ABSL_GUARDED_BY(mu_);
};

// The environment a process started with (/proc/<pid>/environ), NULs as newlines.
std::string EnvironmentOf(pid_t pid) {
  std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
  std::replace(env.begin(), env.end(), '\0', '\n');
  return env;
}

v1::SetupRequest RankSetup(const std::string& job, const std::string& coordinator,
                           const std::string& token) {
  v1::SetupRequest r;
  r.set_job_id(job);
  r.mutable_spec()->mutable_model()->set_builtin("mlp");
  r.mutable_spec()->mutable_optimizer()->set_name("sgd");
  r.mutable_spec()->mutable_optimizer()->set_lr(0.1);
  r.mutable_spec()->mutable_trainer()->set_strategy("ddp");
  r.mutable_spec()->mutable_trainer()->set_collective_backend("grpc");
  r.mutable_spec()->mutable_data()->mutable_synthetic()->set_train_size(256);
  r.mutable_group()->set_coordinator(coordinator);
  r.mutable_group()->set_world_size(1);
  r.mutable_group()->set_register_timeout_ms(5000);
  r.mutable_group()->set_token(token);
  return r;
}

absl::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  return FromGrpcStatus(rpc(&context));
}

// A rank holds only its job's rights (issue 38, item 5): real worker daemons given the admin
// token (by file and in their environment), driven over gRPC by this test as their coordinator.
class RankRightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options = FastOptions();
    options.admin_token = kAdmin;
    coordinator_ = StartCoordinator(options);
    ASSERT_NE(coordinator_, nullptr);
    token_file_ = absl::StrCat(::testing::TempDir(), "/rank-rights-", getpid(), ".token");
    std::ofstream(token_file_) << kAdmin << "\n";
    SetClientToken(kAdmin);  // exported: the worker processes inherit it as DTRAIN_TOKEN too
  }
  void TearDown() override { SetClientToken(""); }

  std::unique_ptr<WorkerProcess> StartWorker(std::vector<std::string> flags = {}) {
    flags.push_back("--token_file=" + token_file_);
    return WorkerProcess::Start(coordinator_->address(), std::move(flags));
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::string token_file_;
};

// With a token the worker runs the job's rank in a child process (--rank_isolation=auto). The
// child's environment holds the job's token and never the admin token, though the daemon's
// own environment holds it; the rank joins the worker's own coordinator, not the one the Setup
// names, and trains; teardown reaps the child.
TEST_F(RankRightsTest, IsolatedRank_HoldsTheJobsTokenOnly_JoinsTheWorkersOwnCoordinator) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  // The daemon was started with the admin token in its environment too (this process's).
  ASSERT_STREQ(std::getenv("DTRAIN_TOKEN"), kAdmin);
  Decoy decoy;
  const std::string job_token = coordinator_->access().IssueJobToken("iso");
  v1::SetupResponse setup;
  ASSERT_TRUE(Call([&](auto* c) {
                return worker->stub().Setup(c, RankSetup("iso", decoy.address(), job_token),
                                            &setup);
              }).ok());
  ASSERT_EQ(setup.ranks_size(), 1);
  const pid_t rank = setup.ranks(0).pid();
  EXPECT_NE(rank, worker->pid()) << "the rank runs in the daemon's own process";
  EXPECT_THAT(ReadFile(absl::StrCat("/proc/", rank, "/status")),
              HasSubstr(absl::StrCat("PPid:\t", worker->pid(), "\n")));
  const std::string env = EnvironmentOf(rank);
  EXPECT_THAT(env, HasSubstr(absl::StrCat("\nDTRAIN_TOKEN=", job_token, "\n")));
  EXPECT_THAT(env, Not(HasSubstr(kAdmin)));
  EXPECT_THAT(ReadFile(absl::StrCat("/proc/", rank, "/cmdline")), Not(HasSubstr(kAdmin)));
  // The worker's token file, seen from the rank's own mount namespace, is empty.
  ASSERT_EQ(ReadFile(token_file_), absl::StrCat(kAdmin, "\n"));
  const std::string absolute = std::filesystem::absolute(token_file_).lexically_normal().string();
  EXPECT_EQ(ReadFile(absl::StrCat("/proc/", rank, "/root", absolute)), "");
  char own[64] = {0}, its[64] = {0};
  ASSERT_GT(readlink("/proc/self/ns/mnt", own, sizeof(own) - 1), 0);
  ASSERT_GT(readlink(absl::StrCat("/proc/", rank, "/ns/mnt").c_str(), its, sizeof(its) - 1), 0);
  EXPECT_STRNE(own, its) << "the rank shares this mount namespace";
  EXPECT_TRUE(decoy.headers().empty()) << "the Setup's coordinator was called";

  v1::StepRequest step;
  step.set_job_id("iso");
  v1::IndexBatch* batch = step.add_work()->add_index_batches();
  batch->set_split("train");
  for (int i = 0; i < 32; ++i) batch->add_indices(i);
  v1::StepResponse trained;
  ASSERT_TRUE(Call([&](auto* c) { return worker->stub().TrainingStep(c, step, &trained); }).ok());
  ASSERT_EQ(trained.results_size(), 1);
  EXPECT_EQ(trained.results(0).global_step(), 1);
  v1::TeardownRequest teardown;
  teardown.set_job_id("iso");
  v1::TeardownResponse torn;
  ASSERT_TRUE(Call([&](auto* c) { return worker->stub().Teardown(c, teardown, &torn); }).ok());
  EXPECT_TRUE(WaitFor([&] { return kill(rank, 0) != 0; }, absl::Seconds(10))) << "not reaped";
}

// A rank in the daemon's process (--rank_isolation=in_process) presents the job's token or
// none: a Setup without one is refused by the coordinator, where the daemon's admin token would
// have let it in.
TEST_F(RankRightsTest, InProcessRank_WithoutAJobToken_PresentsNone) {
  auto worker = StartWorker({"--rank_isolation=in_process"});
  ASSERT_NE(worker, nullptr);
  v1::SetupResponse setup;
  absl::Status refused = Call([&](auto* c) {
    return worker->stub().Setup(c, RankSetup("bare", coordinator_->address(), ""), &setup);
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("requires a bearer token"));
  const std::string job_token = coordinator_->access().IssueJobToken("own");
  ASSERT_TRUE(Call([&](auto* c) {
                return worker->stub().Setup(c, RankSetup("own", "", job_token), &setup);
              }).ok());
  EXPECT_EQ(setup.ranks(0).pid(), worker->pid());
}

TEST_F(RankRightsTest, RankIsolationFlag_AndAChildWithoutItsSecret_Refused) {
  CommandResult bad = RunShell(absl::StrCat(DTRAIN_WORKER_BIN, " --rank_isolation=sometimes 2>&1"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--rank_isolation must be process, in_process or auto"));
  CommandResult child = RunShell(absl::StrCat(DTRAIN_WORKER_BIN, " --child 2>&1"));
  EXPECT_EQ(child.exit_code, 2) << child.output;
  EXPECT_THAT(child.output, HasSubstr("DTRAIN_CHILD_SECRET; it is not set"));
}

}  // namespace token_auth_test
}  // namespace dtrain::testing

// Structured logs from real daemons: with --log_format=json every stderr line of the
// coordinator and of the workers is one JSON object with ts, level, program and msg, and the
// events operators search for (worker registered, group formed, job ended, worker lost, drain)
// carry their worker, group and job as fields (a ddp rank's gradient sync says where its
// buckets start: after backward on shm, during it over Gloo); a group that does not form is one
// warning, not one per waiting member; what protobuf logs about a client's bytes is a record too,
// one a second at most, as is what gRPC logs about failed TLS handshakes; --log_level drops records
// below it; a bad value is refused at start-up naming the flag.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/job_spec.h"
#include "tests/local_cluster.h"
#include "tests/raw_stream.h"

namespace dtrain::testing {
namespace structured_log_test {

using ::testing::HasSubstr;

// Every line of `path`, each parsed as JSON (yaml-cpp reads JSON, a subset of YAML 1.2); a
// line that is not a JSON object with the four fixed keys fails the test, naming it.
std::vector<YAML::Node> Records(const std::string& path, const std::string& program) {
  static const std::regex kTimestamp(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  static const std::set<std::string> kLevels = {"debug", "info", "warning", "error"};
  std::vector<YAML::Node> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    YAML::Node record;
    try {
      EXPECT_EQ(line.front(), '{') << path << ": " << line;
      record = YAML::Load(line);
    } catch (const YAML::Exception& e) {
      ADD_FAILURE() << path << ": not JSON (" << e.what() << "): " << line;
      continue;
    }
    if (!record.IsMap() || !record["ts"] || !record["level"] || !record["program"] ||
        !record["msg"]) {
      ADD_FAILURE() << path << ": missing ts, level, program or msg: " << line;
      continue;
    }
    EXPECT_TRUE(std::regex_match(record["ts"].as<std::string>(), kTimestamp)) << line;
    EXPECT_EQ(kLevels.count(record["level"].as<std::string>()), 1u) << line;
    EXPECT_EQ(record["program"].as<std::string>(), program) << line;
    records.push_back(record);
  }
  return records;
}

// The first record whose msg contains `text` (and whose field `where.first` is `where.second`,
// if given); a null node if none.
YAML::Node Find(const std::vector<YAML::Node>& records, const std::string& text,
                const std::pair<std::string, std::string>& where = {}) {
  for (const YAML::Node& r : records) {
    if (!absl::StrContains(r["msg"].as<std::string>(), text)) continue;
    if (where.first.empty() ||
        (r[where.first] && r[where.first].as<std::string>() == where.second)) {
      return r;
    }
  }
  return YAML::Node();
}

class StructuredLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/logs-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  std::vector<std::string> To(const std::string& name) const {
    return {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + Path(name)};
  }
  std::string Path(const std::string& name) const {
    return absl::StrCat(cluster_->dir(), "/", name, ".stderr");
  }
  std::string RunJob(const std::string& name = "logs", const std::string& trainer_extra = "") {
    const std::string id = cluster_->Submit(name, SyntheticDdpJob(name, 1, 1024, trainer_extra));
    EXPECT_TRUE(
        WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(120)));
    EXPECT_EQ(cluster_->GetJob(id).state(), v1::SUCCEEDED) << cluster_->GetJob(id).reason();
    // A success is published once its workers are released; waited for all the same, so that a
    // regression shows here as a timeout, not as a missing log line.
    EXPECT_TRUE(WaitFor([&] { return cluster_->AliveWorkers(/*idle_only=*/true) == 2; },
                        absl::Seconds(10)));
    return id;
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(StructuredLogTest, Json_EveryLineParses_EventsCarryTheirFields) {
  ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", {"--log_format=json"}, To("coordinator")));
  for (const char* w : {"w0", "w1"}) {
    ASSERT_TRUE(cluster_->AddWorker(w, {"--log_format=json"}, To(w)));
  }
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 2; }, absl::Seconds(30)));
  const std::string id = RunJob();
  // 64 KiB buckets over Gloo: the mlp's fc2 and fc1's bias, then fc1's weight.
  RunJob("logs-gloo", ", collective_backend: gloo, bucket_cap_mb: 0.0625");
  // w1 stops: the coordinator logs its leaving, w1 its drain.
  ASSERT_EQ(cluster_->worker("w1").Stop(), 0);
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 1; }, absl::Seconds(10)));

  const std::vector<YAML::Node> coordinator = Records(Path("coordinator"), "dtrain-coordinator");
  const YAML::Node serving = Find(coordinator, "serving");
  ASSERT_TRUE(serving) << "no 'serving' record";
  EXPECT_EQ(serving["address"].as<std::string>(), cluster_->address());
  const YAML::Node registered = Find(coordinator, "worker 'w0' registered");
  ASSERT_TRUE(registered);
  EXPECT_EQ(registered["worker"].as<std::string>(), "w0");
  EXPECT_EQ(registered["devices"].as<int>(), 1);
  EXPECT_EQ(registered["level"].as<std::string>(), "info");
  const YAML::Node formed = Find(coordinator, absl::StrCat("group '", id, "' formed"));
  ASSERT_TRUE(formed);
  EXPECT_EQ(formed["group"].as<std::string>(), id);
  EXPECT_EQ(formed["world_size"].as<int>(), 2);
  EXPECT_EQ(formed["num_nodes"].as<int>(), 1);
  EXPECT_TRUE(formed["world_size"].Tag() == "?") << "a number, not a quoted string";
  const YAML::Node succeeded = Find(coordinator, "job SUCCEEDED");
  ASSERT_TRUE(succeeded);
  EXPECT_EQ(succeeded["job"].as<std::string>(), id);
  // The job's own log lines reach the coordinator's log with the job's id.
  const YAML::Node epoch = Find(coordinator, "epoch 0 done");
  ASSERT_TRUE(epoch);
  EXPECT_EQ(epoch["job"].as<std::string>(), id);
  EXPECT_TRUE(Find(coordinator, "worker 'w1' unregistered"));

  const std::vector<YAML::Node> w0 = Records(Path("w0"), "dtrain-worker");
  const YAML::Node sync = Find(w0, "gradient sync");
  ASSERT_TRUE(sync) << "no gradient sync record from w0";
  EXPECT_EQ(sync["strategy"].as<std::string>(), "ddp");
  EXPECT_GE(sync["rank"].as<int>(), 0);
  EXPECT_LE(sync["rank"].as<int>(), 1);
  EXPECT_EQ(sync["rounds"].as<int>(), 16);  // 1024 samples / (2 ranks x 32)
  // Two workers of one host: the shm plane, whose all-reduce is CPU work on backward's core, so
  // no bucket starts during backward.
  EXPECT_EQ(sync["backend"].as<std::string>(), "shm");
  EXPECT_EQ(sync["buckets_start"].as<std::string>(), "after backward");
  EXPECT_EQ(sync["buckets"].as<int>(), 1);
  EXPECT_EQ(sync["started_during_backward_pct"].as<double>(), 0);
  // Over Gloo the all-reduce waits on sockets: the first bucket starts during backward, from
  // the autograd hooks, in every round; the last when backward ends.
  const YAML::Node gloo = Find(w0, "gradient sync", {"backend", "gloo"});
  ASSERT_TRUE(gloo) << "no gradient sync record of the gloo job from w0";
  EXPECT_EQ(gloo["buckets_start"].as<std::string>(), "during backward");
  EXPECT_EQ(gloo["buckets"].as<int>(), 2);
  EXPECT_EQ(gloo["started_during_backward_pct"].as<double>(), 50);
  EXPECT_TRUE(Find(w0, "registered as 'w0'"));
  const std::vector<YAML::Node> w1 = Records(Path("w1"), "dtrain-worker");
  const YAML::Node stopping = Find(w1, "stopping: no job here");
  ASSERT_TRUE(stopping);
  EXPECT_EQ(stopping["signal"].as<std::string>(), "Terminated");
}

TEST_F(StructuredLogTest, WarningLevel_DropsInfo_KeepsALostWorker) {
  ASSERT_TRUE(cluster_->StartCoordinator(
      "127.0.0.1:0",
      {"--log_level=warning", "--heartbeat-interval=500ms", "--heartbeat-timeout=5s"},
      To("coordinator")));
  for (const char* w : {"w0", "w1"}) ASSERT_TRUE(cluster_->AddWorker(w));
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 2; }, absl::Seconds(30)));
  RunJob();
  cluster_->worker("w1").process().Kill(SIGKILL);
  std::vector<std::string> lines;
  EXPECT_TRUE(WaitFor(
      [&] {
        lines.clear();
        std::ifstream in(Path("coordinator"));
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        return !lines.empty() && absl::StrContains(lines.back(), "lost");
      },
      absl::Seconds(30)));
  for (const std::string& line : lines) {
    EXPECT_THAT(line, ::testing::AnyOf(HasSubstr(" WARNING "), HasSubstr(" ERROR "))) << line;
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr("dtrain-coordinator: worker 'w1' lost: no heartbeat for"));
  EXPECT_THAT(lines.back(), HasSubstr("worker=w1"));
}

TEST_F(StructuredLogTest, GroupThatDoesNotForm_OneWarningForItsWaitingMembers) {
  ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", {}, To("coordinator")));
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()));
  // Two of three members come, with one deadline: both hear why, the log says it once.
  std::vector<grpc::Status> statuses(2);
  std::vector<std::thread> members;
  for (int i = 0; i < 2; ++i) {
    members.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::RegisterRequest request;
      request.set_group("partial");
      request.set_host(absl::StrCat("h", i));
      request.set_local_devices(1);
      request.set_world_size(3);
      request.set_incarnation(100 + i);
      request.set_timeout_ms(3000);
      v1::RegisterResponse response;
      statuses[i] = stub->Register(&context, request, &response);
    });
  }
  for (std::thread& t : members) t.join();
  for (const grpc::Status& status : statuses) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(status.error_message(), HasSubstr("group 'partial' did not form in time"));
  }
  int warnings = 0;
  std::ifstream in(Path("coordinator"));
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, "did not form in time")) {
      ++warnings;
      EXPECT_THAT(line, HasSubstr(" WARNING "));
      EXPECT_THAT(line, HasSubstr("2 of 3 members registered (hosts: "));
      EXPECT_THAT(line, HasSubstr("h0"));
      EXPECT_THAT(line, HasSubstr("h1"));
    }
  }
  EXPECT_EQ(warnings, 1);
}

// protobuf logs every string field that is not UTF-8 as it refuses the request, so any client
// can make a daemon write: those lines are records of the log (JSON here, where they were raw
// "[libprotobuf ERROR ...]" lines), at most one a second from that line of protobuf, and the
// next says how many were dropped, so that none goes uncounted.
TEST_F(StructuredLogTest, RequestsThatMakeProtobufLog_JsonRecords_OneASecond_NoneUncounted) {
  ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", {"--log_format=json"}, To("coordinator")));
  // GetJobRequest{id: "\xff\xfe"}: a string field that is not UTF-8.
  const std::string not_utf8("\x0a\x02\xff\xfe", 4);
  auto channel = ConnectToCoordinator(cluster_->address(), "");
  constexpr int kBurst = 300;
  for (int i = 0; i <= kBurst; ++i) {
    if (i == kBurst) absl::SleepFor(absl::Milliseconds(1100));  // the next second's record
    const grpc::Status status = RawStream(channel, "/dtrain.v1.Jobs/GetJob", {not_utf8}).status;
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i;
    ASSERT_THAT(status.error_message(), HasSubstr("does not parse as dtrain.v1.GetJobRequest"));
  }
  ASSERT_TRUE(cluster_->StopCoordinator(SIGTERM));
  int records = 0;
  int64_t dropped = 0;
  for (const YAML::Node& r : Records(Path("coordinator"), "dtrain-coordinator")) {
    if (!absl::StrContains(r["msg"].as<std::string>(), "invalid UTF-8")) continue;
    ++records;
    EXPECT_EQ(r["library"].as<std::string>(), "protobuf");
    // The client's fault, refused: not an error of the coordinator's.
    EXPECT_EQ(r["level"].as<std::string>(), "warning");
    EXPECT_THAT(r["source"].as<std::string>(), HasSubstr("wire_format_lite"));
    EXPECT_THAT(r["msg"].as<std::string>(), HasSubstr("dtrain.v1.GetJobRequest.id"));
    if (r["dropped_since_last"]) dropped += r["dropped_since_last"].as<int64_t>();
  }
  EXPECT_GE(records, 2);
  EXPECT_LE(records, 6) << "one a second: the burst takes well under 5 s";
  EXPECT_EQ(records + dropped, kBurst + 1);
}

// gRPC logs each TLS handshake that fails, so a plaintext client or a port scanner makes a TLS
// coordinator write at will: gRPC's lines are records of the log too, and each of its lines of
// code writes at most one a second.
TEST_F(StructuredLogTest, PlaintextClientsOfATlsCoordinator_GrpcLinesAreRecords_OneASecond) {
  CommandResult made = RunShell(
      absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", cluster_->dir()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string dir = cluster_->dir();
  ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0",
                                         {"--log_format=json", "--tls_cert=" + dir + "/server.pem",
                                          "--tls_key=" + dir + "/server.key"},
                                         To("coordinator")));
  for (int i = 0; i < 40; ++i) {  // a fresh connection each, refused at the handshake
    auto channel = grpc::CreateCustomChannel(
        cluster_->address(), grpc::InsecureChannelCredentials(), grpc::ChannelArguments());
    const grpc::Status status =
        RawStream(channel, "/dtrain.v1.Jobs/ListJobs", {""}, absl::Milliseconds(300)).status;
    ASSERT_FALSE(status.ok()) << i;
  }
  ASSERT_TRUE(cluster_->StopCoordinator(SIGTERM));
  std::map<std::string, int> records_per_source;
  int handshake_records = 0;
  for (const YAML::Node& r : Records(Path("coordinator"), "dtrain-coordinator")) {
    if (r["library"] && r["library"].as<std::string>() == "grpc") {
      ++records_per_source[r["source"].as<std::string>()];
      if (absl::StrContains(r["msg"].as<std::string>(), "andshake failed")) {
        ++handshake_records;
        // An error still: a client that does not trust its server logs the same.
        EXPECT_EQ(r["level"].as<std::string>(), "error") << r["msg"].as<std::string>();
      }
    }
  }
  ASSERT_FALSE(records_per_source.empty()) << "gRPC logged no failed handshake";
  EXPECT_GE(handshake_records, 1);
  for (const auto& [source, records] : records_per_source) {
    EXPECT_LE(records, 20) << source << ": one a second, for 40 handshakes of at most 0.3 s";
  }
}

TEST_F(StructuredLogTest, BadLevel_RefusedAtStartNamingTheFlag) {
  const CommandResult result = RunShell(
      absl::StrCat(DTRAIN_COORDINATOR_BIN, " --listen=127.0.0.1:0 --state-dir=", cluster_->dir(),
                   "/state --log_level=verbose 2>&1"));
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.output,
              HasSubstr("--log_level: 'verbose' is not one of debug, info, warning, error"));
  const CommandResult worker =
      RunShell(absl::StrCat(DTRAIN_WORKER_BIN, " --listen=127.0.0.1:0 --log_format=xml 2>&1"));
  EXPECT_EQ(worker.exit_code, 2);
  EXPECT_THAT(worker.output, HasSubstr("--log_format: 'xml' is not one of text, json"));
}

}  // namespace structured_log_test
}  // namespace dtrain::testing

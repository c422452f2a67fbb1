// Every dtrain server answers the standard gRPC health protocol (grpc.health.v1) for itself and
// for each of its services, reports NOT_SERVING as soon as it starts draining, and lists its API
// through server reflection, so generic tools and Kubernetes' probes need no dtrain files.
#include <signal.h>
#include <unistd.h>

#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/local_cluster.h"
#include "tests/raw_stream.h"

namespace dtrain::testing {
namespace standard_services_test {

using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

absl::StatusOr<HealthStatus::ServingStatus> Check(const std::string& address,
                                                  const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(ConnectToCoordinator(address, ""));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthStatus response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok())
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  return response.status();
}

// The server's reflection answer to list_services, as raw bytes (the service names are in it).
std::string ListServicesByReflection(const std::string& address) {
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
  RawStreamResult result =
      RawStream(ConnectToCoordinator(address, ""),
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                {std::string("\x3a\x00", 2)}, absl::Seconds(5));
  return result.answers.empty() ? "" : result.answers.front();
}

// One call of `method` with the request's bytes as given, every answer read; the call's status.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& request_bytes) {
  return RawStream(ConnectToCoordinator(address, ""), method, {request_bytes}, absl::Seconds(5))
      .status;
}

// A cluster of its own per test: a coordinator process and, for the worker's test, one worker.
std::unique_ptr<LocalCluster> NewCluster() {
  return std::make_unique<LocalCluster>(
      absl::StrCat(::testing::TempDir(), "/standard-services-", getpid(), "-",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name()));
}

TEST(StandardServices, CoordinatorHealthAndReflection_NotServingWhenItDrains) {
  auto cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  const std::string address = cluster->address();
  for (const std::string service :
       {"", "dtrain.v1.Coordinator", "dtrain.v1.Workers", "dtrain.v1.Jobs"}) {
    auto status = Check(address, service);
    ASSERT_TRUE(status.ok()) << service << ": " << status.status();
    EXPECT_EQ(*status, HealthStatus::SERVING) << service;
  }
  auto unknown = Check(address, "dtrain.v1.NoSuchService");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  const std::string listed = ListServicesByReflection(address);
  EXPECT_THAT(listed, HasSubstr("dtrain.v1.Coordinator"));
  EXPECT_THAT(listed, HasSubstr("dtrain.v1.Workers"));
  EXPECT_THAT(listed, HasSubstr("dtrain.v1.Jobs"));
  EXPECT_THAT(listed, HasSubstr("grpc.health.v1.Health"));

  // A watcher sees SERVING, then NOT_SERVING once SIGTERM's shutdown begins.
  auto stub = grpc::health::v1::Health::NewStub(ConnectToCoordinator(address, ""));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("dtrain.v1.Jobs");
  auto watch = stub->Watch(&context, request);
  HealthStatus first;
  ASSERT_TRUE(watch->Read(&first));
  EXPECT_EQ(first.status(), HealthStatus::SERVING);
  bool stopped = false;
  std::thread stopper([&] { stopped = cluster->StopCoordinator(SIGTERM); });
  HealthStatus next;
  bool saw_not_serving = false;
  while (watch->Read(&next)) {
    if (next.status() == HealthStatus::NOT_SERVING) {
      saw_not_serving = true;
      break;
    }
  }
  context.TryCancel();
  stopper.join();
  EXPECT_TRUE(saw_not_serving);
  EXPECT_TRUE(stopped) << "the coordinator did not stop on SIGTERM within 15 s";
}

TEST(StandardServices, WorkerHealthAndReflection) {
  auto cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  ASSERT_TRUE(cluster->AddWorker("health-w"));
  const std::string address = absl::StrCat("127.0.0.1:", cluster->worker("health-w").port());
  for (const std::string service : {"", "dtrain.v1.Worker"}) {
    auto status = Check(address, service);
    ASSERT_TRUE(status.ok()) << service << ": " << status.status();
    EXPECT_EQ(*status, HealthStatus::SERVING) << service;
  }
  EXPECT_THAT(ListServicesByReflection(address), HasSubstr("dtrain.v1.Worker"));
  // The CLI's probe: exit 0 and SERVING; a service the worker does not have is refused (3).
  CommandResult probe = RunShell(
      absl::StrCat(DTRAIN_CLI_BIN " health ", address, " --service=dtrain.v1.Worker 2>&1"));
  EXPECT_EQ(probe.exit_code, 0) << probe.output;
  EXPECT_THAT(probe.output, HasSubstr("SERVING"));
  CommandResult unknown =
      RunShell(absl::StrCat(DTRAIN_CLI_BIN " health ", address, " --service=dtrain.v1.Jobs 2>&1"));
  EXPECT_EQ(unknown.exit_code, 3) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));
}

// Bytes that do not parse as the method's message (field 1 with wire type 7, which does not
// exist): gRPC's callback API alone would answer UNIMPLEMENTED with no message, as if the
// method did not exist; every dtrain server answers INVALID_ARGUMENT naming the message.
TEST(StandardServices, UnparsableRequest_InvalidArgumentNamingTheMessage) {
  auto cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  ASSERT_TRUE(cluster->AddWorker("parse-w"));
  const std::string garbage("\x0f\xff\xff", 3);
  const std::string worker = absl::StrCat("127.0.0.1:", cluster->worker("parse-w").port());
  const std::vector<std::tuple<std::string, std::string, std::string>> calls = {
      {cluster->address(), "/dtrain.v1.Jobs/GetJob", "dtrain.v1.GetJobRequest"},
      {cluster->address(), "/dtrain.v1.Jobs/WatchJob", "dtrain.v1.WatchJobRequest"},
      {cluster->address(), "/dtrain.v1.Workers/ListWorkers", "dtrain.v1.ListWorkersRequest"},
      {cluster->address(), "/dtrain.v1.Coordinator/KeyValueGet", "dtrain.v1.KeyValueGetRequest"},
      {cluster->address(), "/dtrain.v1.Artifacts/Fetch", "dtrain.v1.FetchRequest"},
      {worker, "/dtrain.v1.Worker/Health", "dtrain.v1.HealthRequest"},
      {worker, "/dtrain.v1.Worker/StreamStateDict", "dtrain.v1.StateDictRequest"},
      // Served raw, parsed by the coordinator itself.
      {cluster->address(), "/dtrain.v1.Coordinator/Register", "dtrain.v1.RegisterRequest"},
      {cluster->address(), "/dtrain.v1.Coordinator/Session", "dtrain.v1.SessionRequest"},
      {cluster->address(), "/dtrain.v1.Artifacts/Upload", "dtrain.v1.UploadRequest"},
  };
  for (const auto& [address, method, type] : calls) {
    grpc::Status status = RawCall(address, method, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("the request to ", method, " does not parse as ", type)));
  }
  // Bytes that parse are the handler's to judge; a method that does not exist stays UNIMPLEMENTED.
  grpc::Status empty_id = RawCall(cluster->address(), "/dtrain.v1.Jobs/GetJob", "");
  EXPECT_EQ(empty_id.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty_id.error_message(), ::testing::Not(HasSubstr("does not parse")));
  EXPECT_EQ(RawCall(worker, "/dtrain.v1.Worker/Health", "").error_code(), grpc::StatusCode::OK);
  EXPECT_EQ(RawCall(cluster->address(), "/dtrain.v1.Jobs/NoSuchMethod", garbage).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(RawCall(worker, "/dtrain.v1.Worker/NoSuchMethod", garbage).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// gRPC would let a second server bind a port already served (SO_REUSEPORT) and the kernel would
// split new connections between the two; dtrain's servers refuse to start instead, and the
// first keeps serving every client.
TEST(StandardServices, PortAlreadyServed_ASecondServerRefusesToStart_TheFirstServesOn) {
  auto cluster = NewCluster();
  const std::string http_port_file = cluster->dir() + "/http.port";
  const std::string metrics_port_file = cluster->dir() + "/metrics.port";
  ASSERT_TRUE(cluster->StartCoordinator(
      "127.0.0.1:0", {"--http_listen=127.0.0.1:0", "--http_port_file=" + http_port_file,
                      "--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + metrics_port_file}));
  const int http_port = WaitForPortFile(http_port_file, absl::Seconds(10));
  ASSERT_GT(http_port, 0);
  const int metrics_port = WaitForPortFile(metrics_port_file, absl::Seconds(10));
  ASSERT_GT(metrics_port, 0);
  ASSERT_TRUE(cluster->AddWorker("first-w"));
  const std::string address = cluster->address();
  // The same gRPC port; then a free one with the dashboard's or the metrics' port taken.
  const std::string second = absl::StrCat(
      "timeout 20 " DTRAIN_COORDINATOR_BIN " --state_dir=", cluster->dir(), "/second-state ");
  const CommandResult coordinator = RunShell(absl::StrCat(second, "--listen=", address, " 2>&1"));
  EXPECT_EQ(coordinator.exit_code, 1) << coordinator.output;
  EXPECT_THAT(coordinator.output, HasSubstr("cannot listen on " + address));
  EXPECT_THAT(coordinator.output, HasSubstr("already in use"));
  const CommandResult dashboard = RunShell(
      absl::StrCat(second, "--listen=127.0.0.1:0 --http_listen=127.0.0.1:", http_port, " 2>&1"));
  EXPECT_EQ(dashboard.exit_code, 1) << dashboard.output;
  EXPECT_THAT(dashboard.output, HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", http_port,
                                                       " for the dashboard")));
  const CommandResult metrics = RunShell(absl::StrCat(
      second, "--listen=127.0.0.1:0 --metrics_listen=127.0.0.1:", metrics_port, " 2>&1"));
  EXPECT_EQ(metrics.exit_code, 1) << metrics.output;
  EXPECT_THAT(metrics.output, HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", metrics_port,
                                                     " for /metrics")));
  const std::string worker_address = absl::StrCat("127.0.0.1:", cluster->worker("first-w").port());
  const CommandResult worker = RunShell(
      absl::StrCat("timeout 20 " DTRAIN_WORKER_BIN " --name=second-w --coordinator=", address,
                   " --listen=", worker_address, " 2>&1"));
  EXPECT_EQ(worker.exit_code, 1) << worker.output;
  EXPECT_THAT(worker.output, HasSubstr("cannot listen on " + worker_address));
  // New connections all reach the first servers: ten fresh channels, each answered.
  for (int i = 0; i < 10; ++i) {
    auto status = Check(address, "dtrain.v1.Coordinator");
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(*status, HealthStatus::SERVING);
    auto worker_status = Check(worker_address, "dtrain.v1.Worker");
    ASSERT_TRUE(worker_status.ok()) << worker_status.status();
    httplib::Client web("127.0.0.1", http_port);
    auto page = web.Get("/login");
    ASSERT_TRUE(page) << "the first coordinator's dashboard did not answer";
    EXPECT_EQ(page->status, 200);
    httplib::Client scraper("127.0.0.1", metrics_port);
    auto scraped = scraper.Get("/metrics");
    ASSERT_TRUE(scraped) << "the first coordinator's /metrics did not answer";
    EXPECT_THAT(scraped->body, HasSubstr("dtrain_"));
  }
  EXPECT_EQ(cluster->AliveWorkers(), 1);
}

}  // namespace standard_services_test
}  // namespace dtrain::testing

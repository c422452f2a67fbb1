// Server reflection v1 (grpc.reflection.v1), which grpcurl, buf curl and grpcui ask for first, on
// a real coordinator and worker: it lists what v1alpha lists, resolves files, symbols and
// extensions into descriptors that link, answers what it cannot find with an error_response on a
// stream that stays open, and refuses bytes that are no request by name; several servers in one
// process each list their own.
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/standard_services.h"
#include "dtrain/v1/artifacts.grpc.pb.h"
#include "dtrain/v1/jobs.grpc.pb.h"  // dtrain.v1.Jobs in this binary's own pool
#include "tests/local_cluster.h"
#include "tests/raw_stream.h"

#ifndef DTRAIN_GRPC_SERVES_REFLECTION_V1
#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace dtrain::testing {
namespace reflection_v1_test {

namespace rv1 = ::grpc::reflection::v1;
using ::testing::Contains;
using ::testing::HasSubstr;

// One reflection stream: each request answered before the next is sent, as tools use it.
class Reflection {
 public:
  explicit Reflection(const std::string& address)
      : stub_(rv1::ServerReflection::NewStub(ConnectToCoordinator(address, ""))) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    stream_ = stub_->ServerReflectionInfo(&context_);
  }

  rv1::ServerReflectionResponse Ask(const rv1::ServerReflectionRequest& request) {
    rv1::ServerReflectionResponse response;
    EXPECT_TRUE(stream_->Write(request)) << request.ShortDebugString();
    EXPECT_TRUE(stream_->Read(&response)) << request.ShortDebugString();
    return response;
  }

  grpc::Status Close() {
    stream_->WritesDone();
    return stream_->Finish();
  }

 private:
  std::unique_ptr<rv1::ServerReflection::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<rv1::ServerReflectionRequest, rv1::ServerReflectionResponse>>
      stream_;
};

rv1::ServerReflectionRequest ListServices() {
  rv1::ServerReflectionRequest request;
  request.set_list_services("");
  return request;
}

rv1::ServerReflectionRequest ContainingSymbol(const std::string& symbol) {
  rv1::ServerReflectionRequest request;
  request.set_file_containing_symbol(symbol);
  return request;
}

std::vector<std::string> ServiceNames(const rv1::ServerReflectionResponse& response) {
  std::vector<std::string> names;
  for (const auto& s : response.list_services_response().service()) names.push_back(s.name());
  std::sort(names.begin(), names.end());
  return names;
}

// The v1alpha answer to list_services, read as v1's message: the two protocols' messages are the
// same on the wire.
std::vector<std::string> ServiceNamesByV1alpha(const std::string& address) {
  RawStreamResult result =
      RawStream(ConnectToCoordinator(address, ""),
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                {ListServices().SerializeAsString()});
  rv1::ServerReflectionResponse response;
  EXPECT_EQ(result.answers.size(), 1u) << result.status.error_message();
  EXPECT_TRUE(!result.answers.empty() && response.ParseFromString(result.answers.front()));
  return ServiceNames(response);
}

// The files of a file_descriptor_response, in the order sent, each parsed.
std::vector<google::protobuf::FileDescriptorProto> Files(
    const rv1::ServerReflectionResponse& response) {
  std::vector<google::protobuf::FileDescriptorProto> files;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    files.emplace_back();
    EXPECT_TRUE(files.back().ParseFromString(bytes));
  }
  return files;
}

std::vector<std::string> Names(const std::vector<google::protobuf::FileDescriptorProto>& files) {
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.name());
  return names;
}

// The request's bytes as given on a raw v1 stream; the stream's status.
grpc::Status RawRequest(const std::string& address, const std::string& bytes) {
  return RawStream(ConnectToCoordinator(address, ""),
                   "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", {bytes})
      .status;
}

std::unique_ptr<LocalCluster> NewCluster() {
  return std::make_unique<LocalCluster>(
      absl::StrCat(::testing::TempDir(), "/reflection-v1-", getpid(), "-",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name()));
}

TEST(ReflectionV1, Coordinator_ListsResolvesAndLinksAsV1alphaDoes) {
  auto cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  const std::string address = cluster->address();
  Reflection reflection(address);

  const std::vector<std::string> services = ServiceNames(reflection.Ask(ListServices()));
  EXPECT_EQ(services, ServiceNamesByV1alpha(address));
  for (const char* name :
       {"dtrain.v1.Coordinator", "dtrain.v1.Workers", "dtrain.v1.Jobs", "dtrain.v1.Artifacts",
        "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection"}) {
    EXPECT_THAT(services, Contains(name));
  }

  // A method's file, then everything it imports, each once; linked, the service has every
  // method this binary's own descriptor has.
  rv1::ServerReflectionRequest by_method = ContainingSymbol("dtrain.v1.Jobs.SubmitJob");
  by_method.set_host("tool.example:443");
  const rv1::ServerReflectionResponse answer = reflection.Ask(by_method);
  EXPECT_EQ(answer.valid_host(), "tool.example:443");
  EXPECT_EQ(answer.original_request().file_containing_symbol(), "dtrain.v1.Jobs.SubmitJob");
  const auto files = Files(answer);
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files.front().name(), "dtrain/v1/jobs.proto");
  const std::vector<std::string> names = Names(files);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << "twice";
  for (const char* name : {"dtrain/v1/job_spec.proto", "dtrain/v1/setting.proto",
                           "dtrain/v1/worker.proto", "google/protobuf/descriptor.proto"}) {
    EXPECT_THAT(names, Contains(name));
  }
  google::protobuf::SimpleDescriptorDatabase database;
  for (const auto& f : files) ASSERT_TRUE(database.Add(f)) << f.name();
  google::protobuf::DescriptorPool pool(&database);
  const google::protobuf::ServiceDescriptor* jobs = pool.FindServiceByName("dtrain.v1.Jobs");
  ASSERT_NE(jobs, nullptr) << "the reflected files do not link";
  EXPECT_EQ(jobs->method_count(), google::protobuf::DescriptorPool::generated_pool()
                                      ->FindServiceByName("dtrain.v1.Jobs")
                                      ->method_count());
  ASSERT_NE(jobs->FindMethodByName("WatchJob"), nullptr);
  EXPECT_TRUE(jobs->FindMethodByName("WatchJob")->server_streaming());
  EXPECT_NE(pool.FindMessageTypeByName("dtrain.v1.JobSpec"), nullptr);

  // A message, an enum and a file by name: each its own file first.
  EXPECT_EQ(Files(reflection.Ask(ContainingSymbol("dtrain.v1.JobSpec"))).front().name(),
            "dtrain/v1/job_spec.proto");
  EXPECT_EQ(Files(reflection.Ask(ContainingSymbol("dtrain.v1.DType"))).front().name(),
            "dtrain/v1/tensor.proto");
  rv1::ServerReflectionRequest by_file;
  by_file.set_file_by_filename("dtrain/v1/tensor.proto");
  EXPECT_THAT(Names(Files(reflection.Ask(by_file))),
              ::testing::ElementsAre("dtrain/v1/tensor.proto"));

  // setting.proto extends google.protobuf.FieldOptions: its numbers, and its file by number.
  const google::protobuf::FileDescriptor* setting =
      google::protobuf::DescriptorPool::generated_pool()->FindFileByName("dtrain/v1/setting.proto");
  ASSERT_NE(setting, nullptr);
  ASSERT_GT(setting->extension_count(), 0);
  rv1::ServerReflectionRequest numbers;
  numbers.set_all_extension_numbers_of_type("google.protobuf.FieldOptions");
  const rv1::ServerReflectionResponse numbered = reflection.Ask(numbers);
  EXPECT_EQ(numbered.all_extension_numbers_response().base_type_name(),
            "google.protobuf.FieldOptions");
  const auto& listed = numbered.all_extension_numbers_response().extension_number();
  for (int i = 0; i < setting->extension_count(); ++i) {
    EXPECT_THAT(listed, Contains(setting->extension(i)->number()));
  }
  rv1::ServerReflectionRequest by_extension;
  by_extension.mutable_file_containing_extension()->set_containing_type(
      "google.protobuf.FieldOptions");
  by_extension.mutable_file_containing_extension()->set_extension_number(
      setting->extension(0)->number());
  EXPECT_EQ(Files(reflection.Ask(by_extension)).front().name(), "dtrain/v1/setting.proto");

  // What is not there: an error_response naming it, and the stream answers on.
  const rv1::ServerReflectionResponse unknown = reflection.Ask(ContainingSymbol("dtrain.v1.Nope"));
  EXPECT_EQ(unknown.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_response().error_message(), HasSubstr("'dtrain.v1.Nope'"));
  by_file.set_file_by_filename(std::string(5000, 'x'));
  const rv1::ServerReflectionResponse long_name = reflection.Ask(by_file);
  EXPECT_EQ(long_name.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(long_name.error_response().error_message(), HasSubstr("(5000 bytes)"));
  EXPECT_LT(long_name.error_response().error_message().size(), 400u);
  by_extension.mutable_file_containing_extension()->set_extension_number(1);
  EXPECT_THAT(reflection.Ask(by_extension).error_response().error_message(),
              HasSubstr("google.protobuf.FieldOptions has no extension numbered 1"));
  numbers.set_all_extension_numbers_of_type("no.Such");
  EXPECT_EQ(reflection.Ask(numbers).error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  const rv1::ServerReflectionResponse nothing = reflection.Ask(rv1::ServerReflectionRequest());
  EXPECT_EQ(nothing.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(nothing.error_response().error_message(), HasSubstr("list_services"));
  EXPECT_EQ(ServiceNames(reflection.Ask(ListServices())), services);
  EXPECT_TRUE(reflection.Close().ok());
}

TEST(ReflectionV1, Worker_ListsItsService) {
  auto cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  ASSERT_TRUE(cluster->AddWorker("reflect-w"));
  const std::string address = absl::StrCat("127.0.0.1:", cluster->worker("reflect-w").port());
  Reflection reflection(address);
  const std::vector<std::string> services = ServiceNames(reflection.Ask(ListServices()));
  EXPECT_EQ(services, ServiceNamesByV1alpha(address));
  EXPECT_THAT(services, Contains("dtrain.v1.Worker"));
  EXPECT_THAT(services, Contains("grpc.reflection.v1.ServerReflection"));
  const auto files = Files(reflection.Ask(ContainingSymbol("dtrain.v1.Worker")));
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files.front().name(), "dtrain/v1/worker.proto");
  EXPECT_TRUE(reflection.Close().ok());
}

// Bytes that are no request end the stream with INVALID_ARGUMENT naming the message, where
// a typed bidi stream would just end; so does a request past the bound, before it is parsed.
TEST(ReflectionV1, BytesThatAreNoRequest_InvalidArgumentNamingTheMessage) {
  auto cluster = NewCluster();
  ASSERT_TRUE(cluster->StartCoordinator());
  const grpc::Status garbage = RawRequest(cluster->address(), std::string("\x0f\xff\xff", 3));
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(garbage.error_message(),
              HasSubstr("the request to /grpc.reflection.v1.ServerReflection/ServerReflectionInfo "
                        "does not parse as grpc.reflection.v1.ServerReflectionRequest"));
  EXPECT_THAT(garbage.error_message(), HasSubstr("(proto/grpc/reflection/v1/reflection.proto)"));
  rv1::ServerReflectionRequest huge;
  huge.set_file_by_filename(std::string(100 << 10, 'x'));
  const grpc::Status too_big = RawRequest(cluster->address(), huge.SerializeAsString());
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_big.error_message(), HasSubstr("one is at most 65536"));
  // The server serves on.
  Reflection reflection(cluster->address());
  EXPECT_THAT(ServiceNames(reflection.Ask(ListServices())), Contains("dtrain.v1.Jobs"));
  EXPECT_TRUE(reflection.Close().ok());
}

// The plugin gives each server its own service and list, and a server that is gone takes only
// its own with it.
TEST(ReflectionV1, ServersInOneProcess_EachListsItsOwnServices) {
  EnableStandardServices();
  v1::Artifacts::CallbackService artifacts;
  v1::Jobs::CallbackService jobs;
  auto serve = [](grpc::Service* service, int* port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
    builder.RegisterService(service);
    return builder.BuildAndStart();
  };
  int first_port = 0, second_port = 0;
  std::unique_ptr<grpc::Server> first = serve(&artifacts, &first_port);
  std::unique_ptr<grpc::Server> second = serve(&jobs, &second_port);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  const std::string first_address = absl::StrCat("127.0.0.1:", first_port);
  const std::string second_address = absl::StrCat("127.0.0.1:", second_port);
  {
    Reflection reflection(first_address);
    const std::vector<std::string> services = ServiceNames(reflection.Ask(ListServices()));
    EXPECT_THAT(services, Contains("dtrain.v1.Artifacts"));
    EXPECT_THAT(services, ::testing::Not(Contains("dtrain.v1.Jobs")));
    EXPECT_EQ(services, ServiceNamesByV1alpha(first_address));
    EXPECT_TRUE(reflection.Close().ok());
  }
  first->Shutdown();
  first.reset();
  Reflection reflection(second_address);
  const std::vector<std::string> services = ServiceNames(reflection.Ask(ListServices()));
  EXPECT_THAT(services, Contains("dtrain.v1.Jobs"));
  EXPECT_THAT(services, Contains("grpc.reflection.v1.ServerReflection"));
  EXPECT_THAT(services, ::testing::Not(Contains("dtrain.v1.Artifacts")));
  EXPECT_EQ(services, ServiceNamesByV1alpha(second_address));
  EXPECT_TRUE(reflection.Close().ok());
  second->Shutdown();
}

}  // namespace reflection_v1_test
}  // namespace dtrain::testing

#else
// The linked gRPC serves v1 itself (proto/CMakeLists.txt), from its own copy of the protocol.
TEST(ReflectionV1, ServedByTheLinkedGrpc) { GTEST_SKIP() << "gRPC's own plugin serves v1"; }
#endif

// The reflection v1 service and the builder plugin that puts it on every server
// (reflection_v1_service.h).
#include "common/reflection_v1_service.h"

#ifndef DTRAIN_GRPC_SERVES_REFLECTION_V1
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/server_callback.h>

#include "common/grpc_status.h"
#include "common/raw_request.h"
#include "common/reflection_v1_answer.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#endif

namespace dtrain {
#ifndef DTRAIN_GRPC_SERVES_REFLECTION_V1
namespace {

namespace rv1 = ::grpc::reflection::v1;

constexpr char kMethod[] = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";

class ReflectionV1Service final
    : public rv1::ServerReflection::WithRawCallbackMethod_ServerReflectionInfo<
          rv1::ServerReflection::Service> {
 public:
  // The server's service names, once it is built (the vector lives in the grpc::Server).
  void SetServiceList(const std::vector<std::string>* services) { services_.store(services); }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServerReflectionInfo(
      grpc::CallbackServerContext* /*context*/) override {
    return new Reactor(this);
  }

 private:
  // One answer per request: read, answer, write, then read the next; so a client that does not
  // read its answers holds at most one on the server.
  class Reactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Reactor(const ReflectionV1Service* service) : service_(service) { StartRead(&read_); }

    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);  // the client is done asking
      absl::StatusOr<rv1::ServerReflectionRequest> request =
          ParseSmallRequest<rv1::ServerReflectionRequest>(read_, kMethod);
      if (!request.ok()) return Finish(ToGrpcStatus(request.status()));
      const std::string bytes =
          AnswerReflectionV1(*request, service_->services_.load()).SerializeAsString();
      grpc::Slice slice(bytes);
      written_ = grpc::ByteBuffer(&slice, 1);
      StartWrite(&written_);
    }

    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      StartRead(&read_);
    }

    void OnDone() override { delete this; }

   private:
    const ReflectionV1Service* service_;
    grpc::ByteBuffer read_;
    grpc::ByteBuffer written_;
  };

  std::atomic<const std::vector<std::string>*> services_{nullptr};
};

// Registered with each server as it is built; the server keeps the service alive (through the
// initializer) and fills in its list of services once every one is registered.
class ReflectionV1Plugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "dtrain_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* si) override { si->RegisterService(service_); }
  void Finish(grpc::ServerInitializer* si) override {
    service_->SetServiceList(si->GetServiceList());
  }
  void ChangeArguments(const std::string& /*name*/, void* /*value*/) override {}

 private:
  std::shared_ptr<ReflectionV1Service> service_ = std::make_shared<ReflectionV1Service>();
};

std::unique_ptr<grpc::ServerBuilderPlugin> MakePlugin() {
  return std::make_unique<ReflectionV1Plugin>();
}

// Registered while the library loads, as gRPC registers its own v1alpha plugin: gRPC's list of
// plugin factories has no lock, and every ServerBuilder reads it as it is made, so adding to it
// later could race with a builder on another thread.
const bool kRegistered = [] {
  grpc::ServerBuilder::InternalAddPluginFactory(&MakePlugin);
  return true;
}();

}  // namespace

// Referenced by EnableStandardServices, so that this file, and with it the registration above,
// is linked into every binary that serves.
void EnableReflectionV1() { (void)kRegistered; }
#else
void EnableReflectionV1() {}  // the linked gRPC's own plugin serves v1 beside v1alpha
#endif

}  // namespace dtrain

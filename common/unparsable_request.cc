// The interceptor behind AnswerUnparsableRequests (unparsable_request.h).
#include "common/unparsable_request.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace dtrain {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/dtrain.v1.Jobs/GetJob": "dtrain.v1.GetJobRequest", or "" when the pool does not know it.
std::string RequestTypeOf(absl::string_view method) {
  if (method.empty() || method[0] != '/') return "";
  const std::string name = absl::StrReplaceAll(method.substr(1), {{"/", "."}});
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name);
  return descriptor != nullptr ? descriptor->input_type()->full_name() : "";
}

class UnparsableRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequestInterceptor(const char* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // A request that failed to parse arrives as none, and gRPC then answers UNIMPLEMENTED with
    // no message itself; dtrain's handlers never give that answer, so only it is rewritten.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      received_none_ = true;
    }
    if (received_none_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        const std::string type = RequestTypeOf(method_);
        methods->ModifySendStatus(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         absl::StrCat("the request to ", method_, " does not parse as ",
                                      type.empty() ? "its message" : type,
                                      ": a client built from other .proto files than this server's "
                                      "(proto/dtrain/v1), or damaged bytes")));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool received_none_ = false;
};

class UnparsableRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Only a unary or server-streaming request is read before the handler runs, and only there
    // does gRPC answer a failed parse itself. A stream the client writes is read by its reactor,
    // which sees a message that does not parse as the stream's end (Register, Session, Upload
    // and reflection v1 are served raw and parse their own: common/raw_request.h). So no other
    // call, the tensor collectives among them, pays for an interceptor.
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
    return new UnparsableRequestInterceptor(info->method());
  }
};

}  // namespace

void AnswerUnparsableRequests(grpc::ServerBuilder& builder) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<UnparsableRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(creators));
}

}  // namespace dtrain

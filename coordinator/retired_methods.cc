#include "coordinator/retired_methods.h"

#include "absl/strings/str_cat.h"
#include "dtrain/v1/coordinator.grpc.pb.h"
#include "dtrain/v1/workers.grpc.pb.h"

namespace dtrain {
namespace {

// Answers at once, without reading the request: nothing in it changes the answer.
class Refusal final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerGenericBidiReactor* RetiredMethods::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  auto moved = moved_.find(context->method());
  if (moved != moved_.end()) {
    return new Refusal(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat(context->method(), " moved to ", moved->second,
                     " (same messages, same port): this client is older than the coordinator; "
                     "upgrade it")));
  }
  return new Refusal(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                  absl::StrCat("this server has no method ", context->method())));
}

std::map<std::string, std::string> WorkerMethodsMovedToWorkersService() {
  std::map<std::string, std::string> moved;
  for (const char* method :
       {"RegisterWorker", "WorkerHeartbeat", "UnregisterWorker", "ListWorkers"}) {
    moved[absl::StrCat("/", v1::Coordinator::service_full_name(), "/", method)] =
        absl::StrCat("/", v1::Workers::service_full_name(), "/", method);
  }
  return moved;
}

}  // namespace dtrain

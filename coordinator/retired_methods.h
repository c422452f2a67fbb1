// RetiredMethods: what a call to a method this server does not have is answered, for clients
// older than the coordinator. gRPC's own answer is UNIMPLEMENTED with an empty message; this
// answers UNIMPLEMENTED too, but says where a moved method went (the worker RPCs moved from
// dtrain.v1.Coordinator to dtrain.v1.Workers) or that the method is unknown here. It is gRPC's
// generic service: it sees only calls that no registered service takes.
//
// Thread-safety: immutable after construction; gRPC calls CreateReactor from any thread.
#pragma once

#include <map>
#include <string>
#include <utility>

#include <grpcpp/generic/async_generic_service.h>

namespace dtrain {

class RetiredMethods final : public grpc::CallbackGenericService {
 public:
  // `moved`: a retired method's path ("/dtrain.v1.Coordinator/RegisterWorker") to the one that
  // replaces it ("/dtrain.v1.Workers/RegisterWorker").
  explicit RetiredMethods(std::map<std::string, std::string> moved) : moved_(std::move(moved)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  const std::map<std::string, std::string> moved_;
};

// The worker registry's four RPCs, from the Coordinator service to the Workers service.
std::map<std::string, std::string> WorkerMethodsMovedToWorkersService();

}  // namespace dtrain

#include "common/standard_services.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "common/reflection_v1_service.h"

namespace dtrain {

void EnableStandardServices() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  EnableReflectionV1();
}

void SetServing(grpc::Server* server, const std::vector<std::string>& services, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;  // EnableStandardServices was not called before building
  health->SetServingStatus(serving);
  for (const std::string& service : services) health->SetServingStatus(service, serving);
}

}  // namespace dtrain

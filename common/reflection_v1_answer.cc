// AnswerReflectionV1 (reflection_v1_answer.h).
// Not built where the linked gRPC serves v1 itself (proto/CMakeLists.txt).
#ifndef DTRAIN_GRPC_SERVES_REFLECTION_V1
#include "common/reflection_v1_answer.h"

#include <algorithm>
#include <deque>
#include <set>
#include <utility>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/support/status.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

namespace rv1 = ::grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// A name from the request, as an error message shows it: escaped, and cut after 200 bytes.
std::string Shown(const std::string& name) {
  constexpr size_t kMostShown = 200;
  if (name.size() <= kMostShown) return absl::StrCat("'", absl::CHexEscape(name), "'");
  return absl::StrCat("'", absl::CHexEscape(name.substr(0, kMostShown)), "...' (", name.size(),
                      " bytes)");
}

// `file` and every file it imports, directly or not, each once: what a client needs to link the
// file's descriptors without asking again.
void AddFileAndImports(const FileDescriptor* file, rv1::FileDescriptorResponse* out) {
  std::set<const FileDescriptor*> seen{file};
  std::deque<const FileDescriptor*> next{file};
  while (!next.empty()) {
    const FileDescriptor* f = next.front();
    next.pop_front();
    google::protobuf::FileDescriptorProto proto;
    f->CopyTo(&proto);
    out->add_file_descriptor_proto(proto.SerializeAsString());
    for (int i = 0; i < f->dependency_count(); ++i) {
      if (seen.insert(f->dependency(i)).second) next.push_back(f->dependency(i));
    }
  }
}

}  // namespace

rv1::ServerReflectionResponse AnswerReflectionV1(const rv1::ServerReflectionRequest& request,
                                                 const std::vector<std::string>* services) {
  rv1::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  auto error = [&response](grpc::StatusCode code, std::string message) {
    response.mutable_error_response()->set_error_code(code);
    response.mutable_error_response()->set_error_message(std::move(message));
    return response;
  };
  switch (request.message_request_case()) {
    case rv1::ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        return error(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("no file named ", Shown(request.file_by_filename()),
                                  " among this server's descriptors"));
      }
      AddFileAndImports(file, response.mutable_file_descriptor_response());
      return response;
    }
    case rv1::ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* file = pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        return error(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("no symbol named ", Shown(request.file_containing_symbol()),
                                  " among this server's descriptors (a full name, such as "
                                  "dtrain.v1.Jobs or dtrain.v1.Jobs.SubmitJob)"));
      }
      AddFileAndImports(file, response.mutable_file_descriptor_response());
      return response;
    }
    case rv1::ServerReflectionRequest::kFileContainingExtension: {
      const rv1::ExtensionRequest& asked = request.file_containing_extension();
      const auto* type = pool->FindMessageTypeByName(asked.containing_type());
      if (type == nullptr) {
        return error(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("no message type named ", Shown(asked.containing_type())));
      }
      const auto* extension = pool->FindExtensionByNumber(type, asked.extension_number());
      if (extension == nullptr) {
        return error(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat(type->full_name(), " has no extension numbered ",
                                  asked.extension_number()));
      }
      AddFileAndImports(extension->file(), response.mutable_file_descriptor_response());
      return response;
    }
    case rv1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        return error(
            grpc::StatusCode::NOT_FOUND,
            absl::StrCat("no message type named ", Shown(request.all_extension_numbers_of_type())));
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      std::vector<int> numbers;
      for (const auto* e : extensions) numbers.push_back(e->number());
      std::sort(numbers.begin(), numbers.end());
      auto* out = response.mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (int n : numbers) out->add_extension_number(n);
      return response;
    }
    case rv1::ServerReflectionRequest::kListServices: {
      if (services == nullptr) {
        return error(grpc::StatusCode::UNAVAILABLE,
                     "the server is still starting: ask again in a moment");
      }
      auto* out = response.mutable_list_services_response();
      for (const std::string& name : *services) out->add_service()->set_name(name);
      return response;
    }
    case rv1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      break;
  }
  // A kind of request this protocol's file does not know arrives as unknown fields.
  if (!request.GetReflection()->GetUnknownFields(request).empty()) {
    return error(grpc::StatusCode::UNIMPLEMENTED,
                 "the request asks for something this server's reflection v1 does not know");
  }
  return error(grpc::StatusCode::INVALID_ARGUMENT,
               "the request asks nothing: set one of file_by_filename, file_containing_symbol, "
               "file_containing_extension, all_extension_numbers_of_type or list_services");
}

}  // namespace dtrain
#endif  // DTRAIN_GRPC_SERVES_REFLECTION_V1

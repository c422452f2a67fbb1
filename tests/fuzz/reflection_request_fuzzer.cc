// libFuzzer target: bytes as a server reflection v1 request (grpc.reflection.v1), which every
// dtrain server reads from any client before authentication. The bytes arrive as gRPC does, in
// two slices split at a point the input picks, through `ParseSmallRequest` (common/raw_request.h)
// and, when they parse, `AnswerReflectionV1` (common/reflection_v1_answer.h) over this binary's
// descriptors. A crash, a sanitizer report, or an answer that breaks the protocol is a finding:
// the bytes must be refused exactly when protobuf refuses them or they pass the bound; the answer
// must echo the request, answer exactly one way, give only NOT_FOUND, INVALID_ARGUMENT or
// UNIMPLEMENTED (UNAVAILABLE for the services while the server is built), keep its message short
// whatever the request names, and send files that parse, each once, the one asked for (or holding
// the symbol) first. Built and run by tests/fuzz/run.sh.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "common/raw_request.h"
#include "common/reflection_v1_answer.h"
#include "dtrain/v1/jobs.pb.h"

namespace rv1 = ::grpc::reflection::v1;

// libprotobuf logs every string field that is not UTF-8 as it refuses it: millions of lines.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dtrain::v1::SubmitJobRequest linked;  // links jobs.proto and its imports into the pool
  (void)linked;
  if (size == 0) return 0;
  const size_t split = data[0] % (size + 1);
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<grpc::Slice> slices{grpc::Slice(bytes.substr(0, std::min(split, bytes.size()))),
                                  grpc::Slice(bytes.substr(std::min(split, bytes.size())))};
  const grpc::ByteBuffer buffer(slices.data(), slices.size());
  absl::StatusOr<rv1::ServerReflectionRequest> request =
      dtrain::ParseSmallRequest<rv1::ServerReflectionRequest>(buffer, "/fuzz");
  // Refused exactly when protobuf itself refuses the bytes, or they pass the bound.
  rv1::ServerReflectionRequest plain;
  const bool parses = plain.ParseFromString(bytes);
  const bool fits = bytes.size() <= dtrain::kMostSmallRequestBytes;
  if (!request.ok()) {
    if (request.status().code() != absl::StatusCode::kInvalidArgument || (parses && fits))
      std::abort();
    return 0;
  }
  if (!fits || !parses || plain.SerializeAsString() != request->SerializeAsString()) std::abort();
  // The first byte after the split also picks whether the server is still being built.
  const std::vector<std::string> services = {"dtrain.v1.Jobs", "grpc.health.v1.Health"};
  const bool starting = (data[0] & 0x80) != 0;
  const rv1::ServerReflectionResponse answer =
      dtrain::AnswerReflectionV1(*request, starting ? nullptr : &services);

  if (answer.original_request().SerializeAsString() != request->SerializeAsString() ||
      answer.valid_host() != request->host()) {
    std::abort();
  }
  switch (answer.message_response_case()) {
    case rv1::ServerReflectionResponse::kErrorResponse: {
      const int code = answer.error_response().error_code();
      if (code != grpc::StatusCode::NOT_FOUND && code != grpc::StatusCode::INVALID_ARGUMENT &&
          code != grpc::StatusCode::UNIMPLEMENTED &&
          !(code == grpc::StatusCode::UNAVAILABLE && starting && request->has_list_services())) {
        std::abort();
      }
      if (answer.error_response().error_message().size() > 1024) std::abort();
      break;
    }
    case rv1::ServerReflectionResponse::kFileDescriptorResponse: {
      const auto& files = answer.file_descriptor_response().file_descriptor_proto();
      if (files.empty()) std::abort();
      std::set<std::string> names;
      for (const std::string& f : files) {
        google::protobuf::FileDescriptorProto file;
        if (!file.ParseFromString(f) || !names.insert(file.name()).second) std::abort();
        // The file asked for, or the one that holds the symbol, comes first.
        if (names.size() == 1 && request->has_file_by_filename() &&
            file.name() != request->file_by_filename()) {
          std::abort();
        }
        if (names.size() == 1 && request->has_file_containing_symbol() &&
            file.name() != google::protobuf::DescriptorPool::generated_pool()
                               ->FindFileContainingSymbol(request->file_containing_symbol())
                               ->name()) {
          std::abort();
        }
      }
      break;
    }
    case rv1::ServerReflectionResponse::kAllExtensionNumbersResponse:
      if (answer.all_extension_numbers_response().base_type_name() !=
          request->all_extension_numbers_of_type()) {
        std::abort();
      }
      break;
    case rv1::ServerReflectionResponse::kListServicesResponse: {
      if (starting) std::abort();
      const auto& listed = answer.list_services_response().service();
      if (listed.size() != static_cast<int>(services.size())) std::abort();
      for (int i = 0; i < listed.size(); ++i) {
        if (listed[i].name() != services[i]) std::abort();
      }
      break;
    }
    case rv1::ServerReflectionResponse::MESSAGE_RESPONSE_NOT_SET:
      std::abort();
  }
  return 0;
}

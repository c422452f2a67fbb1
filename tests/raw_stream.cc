// RawStream (raw_stream.h), on gRPC's generic stub and a completion queue of its own.
#include "tests/raw_stream.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

namespace dtrain::testing {

RawStreamResult RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::vector<std::string>& requests, absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  // Each operation is waited for before the next starts, so its tag needs no checking.
  auto wait = [&] {
    cq.Next(&tag, &ok);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  wait();
  for (const std::string& bytes : requests) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    if (!wait()) break;  // the server already ended the call
  }
  call->WritesDone(reinterpret_cast<void*>(3));
  wait();
  RawStreamResult result;
  while (true) {
    grpc::ByteBuffer answer;
    call->Read(&answer, reinterpret_cast<void*>(4));
    if (!wait()) break;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (answer.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices)
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    result.answers.push_back(std::move(bytes));
  }
  call->Finish(&result.status, reinterpret_cast<void*>(5));
  wait();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

}  // namespace dtrain::testing

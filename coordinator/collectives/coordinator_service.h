// CoordinatorService: the gRPC edge of the process-group server. Translates dtrain.v1.Coordinator
// RPCs into GroupTable / CollectiveEngine / KeyValueStore calls and their absl::Status answers
// into grpc::Status. Uses the callback API throughout: a rank waiting in a barrier or collective
// holds a reactor, never a thread. Workers are not its business: the job side serves them
// (dtrain.v1.Workers, coordinator/jobs/workers_service.h).
#pragma once

#include <memory>

#include "coordinator/auth/access_control.h"
#include "coordinator/collectives/collective_engine.h"
#include "coordinator/collectives/group_table.h"
#include "coordinator/collectives/kv_store.h"
#include "dtrain/v1/coordinator.grpc.pb.h"

namespace dtrain {

// The four tensor collectives are served raw (zero-copy framing, see tensor_frames.h), and so is
// Register (every member's answer shares the group's encoded member list, see RegisterAnswer)
// and Session (bytes that do not parse are refused by name, not taken for the session's end);
// their messages on the wire are still exactly those of coordinator.proto.
using CoordinatorServiceBase = v1::Coordinator::WithRawCallbackMethod_Register<
    v1::Coordinator::WithCallbackMethod_Heartbeat<v1::Coordinator::WithCallbackMethod_Leave<
        v1::Coordinator::WithCallbackMethod_Barrier<v1::Coordinator::WithRawCallbackMethod_Broadcast<
            v1::Coordinator::WithRawCallbackMethod_AllGather<
                v1::Coordinator::WithRawCallbackMethod_Reduce<
                    v1::Coordinator::WithRawCallbackMethod_AllReduce<
                        v1::Coordinator::WithCallbackMethod_ReduceBooleanDecision<
                            v1::Coordinator::WithRawCallbackMethod_Session<
                                v1::Coordinator::WithCallbackMethod_KeyValueSet<
                                    v1::Coordinator::WithCallbackMethod_KeyValueGet<
                                        v1::Coordinator::WithCallbackMethod_KeyValueAdd<
                                            v1::Coordinator::WithCallbackMethod_KeyValueCompareAndSet<
                                                v1::Coordinator::WithCallbackMethod_KeyValueDelete<
                                                    v1::Coordinator::
                                                        WithCallbackMethod_KeyValueList<
                                                            v1::Coordinator::
                                                                WithCallbackMethod_ListGroups<
                                                                    v1::Coordinator::
                                                                        Service>>>>>>>>>>>>>>>>>;

class StreamSlots;

class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // The pointees must outlive the service.
  CoordinatorService(GroupTable* groups, CollectiveEngine* engine, KeyValueStore* kv,
                     const AccessControl* access);
  ~CoordinatorService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Broadcast(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AllGather(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Reduce(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AllReduce(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ReduceBooleanDecision(
      grpc::CallbackServerContext* context, const v1::ReduceBooleanDecisionRequest* request,
      v1::ReduceBooleanDecisionResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueSetRequest* request,
                                        v1::KeyValueSetResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueGetRequest* request,
                                        v1::KeyValueGetResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueAdd(grpc::CallbackServerContext* context,
                                        const v1::KeyValueAddRequest* request,
                                        v1::KeyValueAddResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueCompareAndSet(
      grpc::CallbackServerContext* context, const v1::KeyValueCompareAndSetRequest* request,
      v1::KeyValueCompareAndSetResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueDelete(grpc::CallbackServerContext* context,
                                           const v1::KeyValueDeleteRequest* request,
                                           v1::KeyValueDeleteResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueList(grpc::CallbackServerContext* context,
                                         const v1::KeyValueListRequest* request,
                                         v1::KeyValueListResponse* response) override;
  grpc::ServerUnaryReactor* ListGroups(grpc::CallbackServerContext* context,
                                       const v1::ListGroupsRequest* request,
                                       v1::ListGroupsResponse* response) override;

 private:
  // OK if the caller may make call `what`: in `group`, or (null `group`) as an admin.
  absl::Status Authorize(const grpc::CallbackServerContext& context, const std::string* group,
                         absl::string_view what) const;
  // Submits a unary collective and finishes its reactor when the engine answers.
  grpc::ServerUnaryReactor* SubmitUnary(CollectiveCall call,
                                        std::function<void(const CollectiveResult&)> fill);

  GroupTable* const groups_;
  CollectiveEngine* const engine_;
  KeyValueStore* const kv_;
  const AccessControl* const access_;
  // Open tensor streams, capped in total and per member (coordinator_service.cc).
  std::unique_ptr<StreamSlots> slots_;
};

}  // namespace dtrain

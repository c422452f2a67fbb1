#include "worker/collectives/collective_plane.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_settings.h"
#include "common/status_macros.h"
#include "worker/collectives/gloo_collective_backend.h"
#include "worker/collectives/shared_memory_collective_backend.h"

namespace dtrain {

absl::StatusOr<CollectivePlane> ConnectCollectivePlane(
    const std::string& requested, const std::string& coordinator,
    std::unique_ptr<ProcessGroup> group, absl::Duration timeout, absl::Duration connect_timeout,
    bool clear_peer_traffic_allowed, const std::string& host) {
  CollectivePlane plane;
  if (requested.empty() || requested == "grpc") {
    plane.backend = std::make_unique<GrpcCollectiveBackend>(std::move(group));
    plane.name = "grpc";
    return plane;
  }
  // A name dtrain knows and refuses (nccl), with the spec's own reason (job_spec.proto). A
  // Setup's spec was refused already (NormalizeSetupRequest); this keeps direct callers honest.
  const JobSetting* setting = FindJobSetting("trainer.collective_backend");
  for (const v1::Setting::Word& refused : setting->setting->refused()) {
    if (refused.word() == requested) {
      return absl::FailedPreconditionError(
          absl::StrCat("collective backend '", requested, "' ", refused.value()));
    }
  }
  if (requested != "auto" && requested != "gloo" && requested != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown collective backend '", requested, "'; use auto, grpc, gloo or shm"));
  }
  const bool fall_back = requested == "auto";
  std::unique_ptr<CollectiveBackend> inner;
  // On one host the shared-memory plane carries every collective's data itself, over the
  // coordinator's plane for what it cannot (integer reductions) and for its own set-up: no Gloo
  // context is made, nor its transport thread, which wakes 100 times a second on the cores the
  // ranks step on. Every rank learns the same answer (the segment's set-up is collective).
  std::string no_shared_memory;
  if (requested != "gloo") {
    auto borrowing = std::make_unique<GrpcCollectiveBackend>(group.get());
    GrpcCollectiveBackend* const coordinator_plane = borrowing.get();
    DTRAIN_ASSIGN_OR_RETURN(
        std::unique_ptr<SharedMemoryCollectiveBackend> shm,
        SharedMemoryCollectiveBackend::Make(std::move(borrowing), timeout, host));
    if (shm->active()) {
      coordinator_plane->Adopt(std::move(group));
      plane.name = "shm";
      plane.backend = std::move(shm);
      return plane;
    }
    no_shared_memory = absl::StrCat("no shared memory: ", shm->fallback_reason());
  }
  // Every rank must choose alike, and one worker may have been started differently: Gloo only
  // when every rank's worker allows clear peer traffic.
  CollectiveOptions agree;
  agree.timeout = timeout;
  DTRAIN_ASSIGN_OR_RETURN(const bool clear_everywhere,
                          group->ReduceBooleanDecision(clear_peer_traffic_allowed, true, agree));
  if (!clear_everywhere) {
    if (requested == "gloo") {
      return absl::FailedPreconditionError(
          "collective_backend gloo would carry gradients between workers in clear while this "
          "cluster runs TLS (Debian's Gloo has no encryption); use auto or grpc, or start every "
          "worker with --trusted_network if the network between them is trusted");
    }
    plane.note =
        "Gloo is not used: this cluster runs TLS and Gloo has no encryption (workers' "
        "--trusted_network allows it); across hosts the coordinator's grpc collectives carry "
        "the gradients";
    inner = std::make_unique<GrpcCollectiveBackend>(std::move(group));
  }
  // Explicit gloo or shm gets the same connect budget: peers that have not connected by then
  // (after the agreement above, which every rank leaves together) never will.
  GlooConnectOptions connect;
  connect.timeout = connect_timeout;
  connect.caller_agrees_on_failure = fall_back;
  absl::StatusOr<std::unique_ptr<GlooCollectiveBackend>> gloo =
      inner != nullptr ? absl::StatusOr<std::unique_ptr<GlooCollectiveBackend>>(
                             absl::FailedPreconditionError("not connected"))
                       : GlooCollectiveBackend::Make(coordinator, group.get(), timeout, connect);
  if (inner != nullptr) {
    // Decided above, together.
  } else if (fall_back) {
    // One rank's Gloo may connect while another's fails; the coordinator decides for all. A
    // rank whose Gloo failed at once waits here for those still trying to connect (up to the
    // connect timeout); a rank that died meanwhile fails this decision, named.
    CollectiveOptions decide;
    decide.timeout = 2 * connect_timeout + absl::Seconds(30);
    DTRAIN_ASSIGN_OR_RETURN(const bool everyone,
                            group->ReduceBooleanDecision(gloo.ok(), true, decide));
    if (!everyone) {
      plane.note = gloo.ok() ? "another rank's Gloo could not connect to its peers"
                             : std::string(gloo.status().message());
      plane.note = absl::StrCat("peer-to-peer collectives are not possible (", plane.note,
                                "); falling back to the coordinator's grpc collectives");
      inner = std::make_unique<GrpcCollectiveBackend>(std::move(group));
    }
  } else {
    DTRAIN_RETURN_IF_ERROR(gloo.status());
  }
  if (inner == nullptr) {
    (*gloo)->Adopt(std::move(group));
    inner = std::move(*gloo);
  }
  plane.name = inner->name();
  if (!no_shared_memory.empty()) {
    plane.note =
        plane.note.empty() ? no_shared_memory : absl::StrCat(plane.note, "; ", no_shared_memory);
  }
  plane.backend = std::move(inner);
  return plane;
}

}  // namespace dtrain

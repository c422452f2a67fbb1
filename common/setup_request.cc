#include "common/setup_request.h"

#include "absl/strings/str_cat.h"
#include "common/job_settings.h"
#include "common/job_spec.h"

namespace dtrain {

v1::SetupRequest MakeSetupRequest(const v1::JobSpec& spec, const SetupContext& context) {
  v1::SetupRequest request;
  request.set_job_id(context.job_id);
  *request.mutable_spec() = spec;
  const bool fit = spec.stage() == "fit" || spec.stage().empty();
  ClearCoordinatorSettings(request.mutable_spec());
  if (!fit) request.mutable_spec()->mutable_checkpoint()->clear_dirpath();
  request.set_store_checkpoints(fit && spec.checkpoint().dirpath().empty());
  v1::GroupSpec* group = request.mutable_group();
  group->set_coordinator(context.coordinator);
  group->set_group(context.group.empty() ? context.job_id : context.group);
  group->set_token(context.token);
  group->set_world_size(context.world_size);
  group->set_register_timeout_ms(absl::ToInt64Milliseconds(context.register_timeout));
  return request;
}

absl::Status NormalizeSetupRequest(v1::SetupRequest* request) {
  if (absl::Status s = NormalizeJobSpec(request->mutable_spec()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("spec.", s.message()));
  }
  // What a worker may read is what the coordinator sends it, defaults or not.
  ClearCoordinatorSettings(request->mutable_spec());
  if (request->group().world_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.world_size: must be >= 0, got ", request->group().world_size()));
  }
  if (request->group().register_timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.register_timeout_ms: must be >= 0 (0: 5 minutes), got ",
                     request->group().register_timeout_ms()));
  }
  if (request->spawn_index() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spawn_index: must be >= 0, got ", request->spawn_index()));
  }
  return absl::OkStatus();
}

}  // namespace dtrain

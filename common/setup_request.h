// The Setup a worker receives, made on the coordinator and checked on the worker by the same
// rules: MakeSetupRequest puts a normalized JobSpec's worker-side settings (Setting.side
// WORKERS) into SetupRequest.spec beside the run's context, and NormalizeSetupRequest, which
// the worker runs on every Setup, normalizes that spec with NormalizeJobSpec again, so a
// hand-written Setup is held to the rules a submitted spec is.
//
// Thread-safety: free functions over values.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

// What the trainer adds to a spec for one run on its workers: the run's context, no settings.
struct SetupContext {
  std::string job_id;
  std::string coordinator;  // the address workers reach the coordinator at
  std::string group;        // the run's group id
  std::string token;        // the job's token in that group ("": none)
  int world_size = 1;
  absl::Duration register_timeout = absl::Minutes(5);
};

// The Setup a worker receives for a normalized `spec`: its worker-side settings in `spec`
// (coordinator-only ones cleared), the context's group. Only fit writes checkpoints: for it,
// rank 0 writes them into the spec's checkpoint.dirpath or, without one, into its own directory
// and sends them to the coordinator (store_checkpoints); another stage gets no dirpath.
v1::SetupRequest MakeSetupRequest(const v1::JobSpec& spec, const SetupContext& context);

// The worker's side: normalizes request->spec() by NormalizeJobSpec (any well-formed plugin
// name passes; the worker's registry says whether it has it), then clears the coordinator-only
// fields again, and checks the context. INVALID_ARGUMENT (FAILED_PRECONDITION for a name this
// build refuses) starting with the request's field path: "spec.trainer.devices: ...".
absl::Status NormalizeSetupRequest(v1::SetupRequest* request);

}  // namespace dtrain

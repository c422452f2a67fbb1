// The job spec's rules, shared by the dtrain client (which checks a file before sending it) and
// the coordinator (which checks every SubmitJob, since the proto is public API): defaults filled
// in, and every bad value refused with INVALID_ARGUMENT naming the field's path, e.g.
// "trainer.strategy: unknown strategy 'fsdp9'; use ddp, ddp_spawn, sharded, dp or single_device".
// Whether a model file loads is the worker's to say; a job whose model fails ends FAILED with
// the worker's message.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// Plugins the cluster's workers offer beyond dtrain's own (their registrations), keyed by
// (kind, name) with kind one of accelerator, precision, strategy, checkpoint_io; the value is
// the names of the workers offering it.
using OfferedPlugins = std::map<std::pair<std::string, std::string>, std::vector<std::string>>;

// Validates `spec` and fills in its defaults (documented in jobs.proto). A strategy, precision,
// accelerator or checkpoint_io that is not dtrain's own must be one `offered` lists; with
// `offered` null (the client, which cannot know) any well-formed name passes.
absl::Status NormalizeJobSpec(v1::JobSpec* spec, const OfferedPlugins* offered = nullptr);

// The plugins a normalized `spec` names that are not dtrain's own, as (kind, name).
std::vector<std::pair<std::string, std::string>> PluginsNamedBy(const v1::JobSpec& spec);

// Ranks one worker contributes under the spec's strategy (devices for ddp_spawn, else 1).
int RanksPerWorker(const v1::JobSpec& spec);

// SUCCEEDED, FAILED or CANCELLED: the job will not change again.
bool IsTerminal(v1::JobState state);

// max for metrics named like accuracies, min otherwise (Lightning's users set it; this is the
// default when they do not).
std::string DefaultMode(const std::string& monitor);

}  // namespace dtrain

// The job spec's rules, shared by the dtrain client (which checks a file before sending it) and
// the coordinator (which checks every SubmitJob, since the proto is public API): defaults filled
// in, and every bad value refused with INVALID_ARGUMENT naming the field's path, e.g.
// "trainer.strategy: unknown strategy 'fsdp9'; use ddp, ddp_spawn, sharded, dp, single_device".
// Whether a model file loads is the worker's to say; a job whose model fails ends FAILED with
// the worker's message.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/plugin_catalog.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// trainer.max_epochs of a spec that sets only max_steps: no epoch limit (the steps bound the
// run). Progress views print no epoch total for it.
inline constexpr int32_t kNoEpochLimit = 1 << 20;
// trainer.max_epochs when neither it nor max_steps is set, as Lightning's Trainer defaults it.
inline constexpr int32_t kLightningDefaultEpochs = 1000;
// The most ranks a group holds: every member's answer at the coordinator's rendezvous lists
// every member (coordinator/collectives/group_table.cc), and one answer must fit a default
// client's 4 MiB. A spec asking for more is refused at submit, naming its settings.
inline constexpr int kMostGroupRanks = 4096;

// Validates `spec` and fills in its defaults: first every field's own Setting option
// (ApplySettings, common/job_settings.h: defaults, ranges, names, plugin names), then the rules
// that relate several fields (an epoch limit, whole validation intervals above 1, nesterov's
// momentum, normalize only for a tensors_file, a one-process strategy on one node, elastic
// bounds, checkpoint modes, file references, an absolute checkpoint.dirpath, marked
// "worker:"). A strategy, precision, accelerator or checkpoint_io that is not dtrain's own must
// be one `offered` lists; with `offered` null (the client, which cannot know) any well-formed
// name passes.
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

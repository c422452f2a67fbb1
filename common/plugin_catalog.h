// dtrain's own plugins, by kind, in the one libtorch-free place: the names a job spec may give
// a strategy, precision, accelerator or checkpoint_io, their aliases (Lightning's other
// spellings), what each strategy is (distributed or one process, one rank per worker or one per
// device), and the names Lightning knows that this build refuses, with why. The spec's rules
// (common/job_spec.h) and the coordinator read names and traits here; the worker's registry
// (worker/plugins/plugin_registry.h) attaches a factory to every entry this build runs, and
// worker_accelerator_test checks that each has one, with the same traits.
//
// Thread-safety: immutable; safe from any thread.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// How a strategy runs, for the worker daemon and the coordinator. A plugin strategy (not one of
// dtrain's own) runs as ddp does: one rank per worker process, in a group of num_nodes ranks.
struct StrategyTraits {
  bool distributed = false;        // joins a group on the coordinator
  bool spawns_per_device = false;  // the daemon spawns one child rank per local device
  bool data_parallel = false;      // one process, replicas on the local devices
};

struct PluginCatalogEntry {
  std::string name;
  std::vector<std::string> aliases;  // other spellings a spec may use; normalized to `name`
  std::string description;
  StrategyTraits traits;  // strategies only
  // Non-empty: a name this build cannot run, and what to do instead. A spec naming it is
  // refused with FAILED_PRECONDITION ("'<name>' <refusal>"), never as an unknown name.
  std::string refusal;
};

// "accelerator", "precision", "strategy", "checkpoint_io": the job spec's and WorkerInfo's words.
const std::vector<std::string>& PluginKindNames();

// dtrain's own plugins of `kind` (one of PluginKindNames()), in the order messages list them;
// refused names included. Empty for another kind.
const std::vector<PluginCatalogEntry>& PluginCatalog(absl::string_view kind);
// The names of the entries of `kind` this build runs (no aliases, no refused names).
std::vector<std::string> CatalogNames(absl::string_view kind);
// The entry that `name` or one of its aliases names, refused ones included; null when `name`
// is none of dtrain's own.
const PluginCatalogEntry* FindInCatalog(absl::string_view kind, absl::string_view name);

// Whether `name` can name a plugin: 1 to 64 characters of a-z, 0-9, '_', '-' and '.'.
bool IsPluginName(absl::string_view name);

// The strategy's traits: a catalog strategy's, or ddp's for any other (a plugin's).
StrategyTraits StrategyTraitsOf(absl::string_view strategy);
// Strategies with more than one rank, which join a group on the coordinator: ddp, ddp_spawn,
// sharded, and any plugin strategy.
bool IsDistributedStrategy(absl::string_view strategy);

// Plugins the cluster's workers offer beyond dtrain's own (their registrations), keyed by
// (kind, name); the value is the names of the workers offering it.
using OfferedPlugins = std::map<std::pair<std::string, std::string>, std::vector<std::string>>;

// A spec's `*name` for a plugin of `kind`, checked: an alias becomes its entry's name; a name
// this build refuses is FAILED_PRECONDITION; a name that is neither dtrain's own nor one
// `offered` lists is INVALID_ARGUMENT listing both (with `offered` null, as in the client, which
// cannot know the cluster, any well-formed plugin name passes). Messages start with `path`.
absl::Status ResolvePluginName(absl::string_view path, absl::string_view kind, std::string* name,
                               const OfferedPlugins* offered);

}  // namespace dtrain

// The worker's plugins as a job spec names them: PluginRegistry::Global(), dtrain's own plugins
// of every kind (each part registers its own: RegisterBuiltinAccelerators, ...Precisions,
// ...Strategies, ...CheckpointIO) plus what --plugin libraries add, and the lookups a job's setup
// makes through it. It lives in the runtime because only here are all four kinds visible; the
// parts below register into a registry they are given and never read the global one.
//
// Thread-safety: thread-safe (the registry is).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/plugins/plugin_registry.h"

namespace dtrain {

// The registered strategy `name` names (PluginRegistry::Global()), an alias of the catalog
// (common/plugin_catalog.h) by its name: ddp_sharded is sharded. FAILED_PRECONDITION for a name
// the catalog refuses (tpu_spawn, xla), with its message; INVALID_ARGUMENT listing the
// registered names for one nobody registered.
absl::StatusOr<PluginRegistry::StrategyEntry> ResolveStrategy(const std::string& name);

// The registered strategy `options.name`. `backend` is the job's group (distributed
// strategies) or, when null, a LocalCollectiveBackend; a one-process strategy refuses a group
// of more than one rank.
absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(StrategyOptions options,
                                                       std::unique_ptr<CollectiveBackend> backend);

}  // namespace dtrain

#include "worker/runtime/registered_plugins.h"

#include "absl/strings/str_cat.h"
#include "common/plugin_catalog.h"
#include "common/status_macros.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/collectives/collective_backend.h"
#include "worker/precision/precision.h"
#include "worker/runtime/accelerator.h"
#include "worker/strategies/strategy.h"

namespace dtrain {

PluginRegistry& PluginRegistry::Global() {
  static PluginRegistry* registry = [] {
    auto* made = new PluginRegistry();
    RegisterBuiltinAccelerators(*made);
    RegisterBuiltinPrecisions(*made);
    RegisterBuiltinStrategies(*made);
    RegisterBuiltinCheckpointIO(*made);
    return made;
  }();
  return *registry;
}

absl::StatusOr<PluginRegistry::StrategyEntry> ResolveStrategy(const std::string& name) {
  std::string registered = name;
  if (const PluginCatalogEntry* own = FindInCatalog("strategy", name); own != nullptr) {
    if (!own->refusal.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("strategy '", name, "' ", own->refusal));
    }
    registered = own->name;
  }
  return PluginRegistry::Global().FindStrategy(registered);
}

absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(StrategyOptions options,
                                                       std::unique_ptr<CollectiveBackend> backend) {
  DTRAIN_ASSIGN_OR_RETURN(PluginRegistry::StrategyEntry entry, ResolveStrategy(options.name));
  options.traits = entry.traits;
  if (backend == nullptr) backend = std::make_unique<LocalCollectiveBackend>();
  if (!entry.traits.distributed && backend->world_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy ", options.name, " runs in one process, but its group has ",
                     backend->world_size(), " ranks; use ddp for several"));
  }
  return entry.make(options, std::move(backend));
}

}  // namespace dtrain

#include "common/plugin_catalog.h"

#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

// The message of a refused XLA name, for strategies and accelerators alike.
constexpr char kNoXla[] =
    "needs an XLA runtime (torch_xla / PJRT) and TPU devices, which libtorch's C++ API does not "
    "have here; use ";

PluginCatalogEntry Runs(std::string name, std::vector<std::string> aliases, std::string description,
                        StrategyTraits traits = {}) {
  return {std::move(name), std::move(aliases), std::move(description), traits, ""};
}

PluginCatalogEntry Refused(std::string name, std::vector<std::string> aliases,
                           std::string refusal) {
  return {std::move(name), std::move(aliases), "", {}, std::move(refusal)};
}

const std::vector<PluginCatalogEntry>& Strategies() {
  static const auto* entries = new std::vector<PluginCatalogEntry>{
      Runs("ddp", {}, "one rank per process; gradients averaged in buckets during backward",
           {.distributed = true}),
      Runs("ddp_spawn", {},
           "ddp with one child process per local device, spawned by the worker daemon",
           {.distributed = true, .spawns_per_device = true}),
      Runs("sharded", {"ddp_sharded"}, "ddp plus ZeRO stage 1 (optimizer state sharded)",
           {.distributed = true}),
      Runs("dp", {}, "one process; the batch split across replicas on the local devices",
           {.data_parallel = true}),
      Runs("single_device", {}, "one process, one device"),
      Refused("tpu_spawn", {"xla"}, absl::StrCat(kNoXla, "ddp or ddp_spawn")),
  };
  return *entries;
}

const std::vector<PluginCatalogEntry>& Precisions() {
  static const auto* entries = new std::vector<PluginCatalogEntry>{
      Runs("32-true", {"32"}, "float32 parameters and compute"),
      Runs("64-true", {"64"}, "float64 parameters and compute"),
      Runs("bf16-mixed", {"bf16"}, "float32 parameters, bfloat16 autocast"),
      Runs("bf16-true", {}, "bfloat16 parameters and compute"),
      Runs("16-mixed", {"16"}, "float32 parameters, float16 autocast with a loss scaler (CUDA)"),
  };
  return *entries;
}

const std::vector<PluginCatalogEntry>& Accelerators() {
  static const auto* entries = new std::vector<PluginCatalogEntry>{
      Runs("cpu", {}, "the CPU"),
      Runs("gpu", {"cuda"}, "CUDA devices (a CUDA build of libtorch)"),
      Runs("auto", {}, "CUDA devices when the worker has them, else the CPU"),
      Refused("tpu", {}, absl::StrCat(kNoXla, "cpu, gpu or auto")),
      Refused("ipu", {"hpu", "mps"},
              "needs a vendor runtime dtrain's libtorch C++ runtime does not have; use cpu, gpu "
              "or auto"),
  };
  return *entries;
}

const std::vector<PluginCatalogEntry>& CheckpointIOs() {
  static const auto* entries = new std::vector<PluginCatalogEntry>{
      Runs("torch", {}, "torch.save's format, written to a temporary file and renamed into place"),
  };
  return *entries;
}

}  // namespace

const std::vector<std::string>& PluginKindNames() {
  static const auto* names =
      new std::vector<std::string>{"accelerator", "precision", "strategy", "checkpoint_io"};
  return *names;
}

const std::vector<PluginCatalogEntry>& PluginCatalog(absl::string_view kind) {
  if (kind == "strategy") return Strategies();
  if (kind == "precision") return Precisions();
  if (kind == "accelerator") return Accelerators();
  if (kind == "checkpoint_io") return CheckpointIOs();
  static const auto* none = new std::vector<PluginCatalogEntry>();
  return *none;
}

std::vector<std::string> CatalogNames(absl::string_view kind) {
  std::vector<std::string> names;
  for (const PluginCatalogEntry& e : PluginCatalog(kind)) {
    if (e.refusal.empty()) names.push_back(e.name);
  }
  return names;
}

const PluginCatalogEntry* FindInCatalog(absl::string_view kind, absl::string_view name) {
  for (const PluginCatalogEntry& e : PluginCatalog(kind)) {
    if (e.name == name || absl::c_linear_search(e.aliases, name)) return &e;
  }
  return nullptr;
}

bool IsPluginName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return absl::c_all_of(name, [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

StrategyTraits StrategyTraitsOf(absl::string_view strategy) {
  const PluginCatalogEntry* own = FindInCatalog("strategy", strategy);
  if (own != nullptr) return own->traits;
  return FindInCatalog("strategy", "ddp")->traits;
}

bool IsDistributedStrategy(absl::string_view strategy) {
  return StrategyTraitsOf(strategy).distributed;
}

absl::Status ResolvePluginName(absl::string_view path, absl::string_view kind, std::string* name,
                               const OfferedPlugins* offered) {
  if (const PluginCatalogEntry* own = FindInCatalog(kind, *name); own != nullptr) {
    if (!own->refusal.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": '", *name, "' ", own->refusal));
    }
    *name = own->name;
    return absl::OkStatus();
  }
  if (offered == nullptr && IsPluginName(*name)) return absl::OkStatus();
  if (offered != nullptr && offered->count({std::string(kind), *name}) > 0) {
    return absl::OkStatus();
  }
  std::vector<std::string> plugins;
  if (offered != nullptr) {
    for (const auto& [key, workers] : *offered) {
      if (key.first == kind) {
        plugins.push_back(absl::StrCat(key.second, " (", absl::StrJoin(workers, ", "), ")"));
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown ", kind, " '", *name, "'; use ", absl::StrJoin(CatalogNames(kind), ", "),
      plugins.empty()
          ? std::string(", or a plugin a worker offers (none do now)")
          : absl::StrCat(", or a plugin a worker offers: ", absl::StrJoin(plugins, ", "))));
}

}  // namespace dtrain

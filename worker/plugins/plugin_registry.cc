#include "worker/plugins/plugin_registry.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/plugin_catalog.h"

namespace dtrain {
namespace {

template <typename Map>
std::vector<std::string> KeysOf(const Map& map) {
  std::vector<std::string> keys;
  for (const auto& [name, entry] : map) keys.push_back(name);
  return keys;
}

}  // namespace

const char* PluginKindName(PluginKind kind) {
  switch (kind) {
    case PluginKind::kAccelerator:
      return "accelerator";
    case PluginKind::kPrecision:
      return "precision";
    case PluginKind::kStrategy:
      return "strategy";
    case PluginKind::kCheckpointIO:
      return "checkpoint_io";
  }
  return "unknown";
}

absl::Status PluginRegistry::Check(PluginKind kind, const std::string& name) const {
  if (!IsPluginName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(PluginKindName(kind), " plugin name '", name,
                     "' must be 1 to 64 characters of a-z, 0-9, '_', '-' and '.'"));
  }
  const bool taken = (kind == PluginKind::kStrategy && strategies_.count(name) > 0) ||
                     (kind == PluginKind::kPrecision && precisions_.count(name) > 0) ||
                     (kind == PluginKind::kAccelerator && accelerators_.count(name) > 0) ||
                     (kind == PluginKind::kCheckpointIO && checkpoint_ios_.count(name) > 0);
  if (taken) {
    return absl::AlreadyExistsError(
        absl::StrCat(PluginKindName(kind), " '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

PluginInfo PluginRegistry::Info(PluginKind kind, const std::string& name,
                                const std::string& description) const {
  return PluginInfo{kind, name, description, loading_};
}

absl::Status PluginRegistry::Added(absl::Status status) {
  if (!status.ok() && load_failure_.ok()) load_failure_ = status;
  return status;
}

absl::Status PluginRegistry::InsertStrategy(const std::string& name, StrategyTraits traits,
                                            StrategyFactory make, const std::string& description) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(PluginKind::kStrategy, name); !s.ok()) return Added(s);
  strategies_[name] = {Info(PluginKind::kStrategy, name, description), traits, std::move(make)};
  return absl::OkStatus();
}

absl::Status PluginRegistry::InsertPrecision(const std::string& name, Precision planned_as,
                                             PrecisionFactory make,
                                             const std::string& description) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(PluginKind::kPrecision, name); !s.ok()) return Added(s);
  precisions_.emplace(name, PrecisionEntry{Info(PluginKind::kPrecision, name, description),
                                           planned_as, std::move(make)});
  return absl::OkStatus();
}

absl::Status PluginRegistry::InsertAccelerator(const std::string& name,
                                               const std::string& planned_as,
                                               AcceleratorFactory make,
                                               const std::string& description) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(PluginKind::kAccelerator, name); !s.ok()) return Added(s);
  if (planned_as != "cpu" && planned_as != "gpu" && planned_as != "auto") {
    return Added(absl::InvalidArgumentError(absl::StrCat("accelerator '", name, "' is planned as '",
                                                         planned_as, "'; use cpu, gpu or auto")));
  }
  accelerators_[name] = {Info(PluginKind::kAccelerator, name, description), planned_as,
                         std::move(make)};
  return absl::OkStatus();
}

absl::Status PluginRegistry::InsertCheckpointIO(const std::string& name, CheckpointIOFactory make,
                                                const std::string& description) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Check(PluginKind::kCheckpointIO, name); !s.ok()) return Added(s);
  checkpoint_ios_[name] = {Info(PluginKind::kCheckpointIO, name, description), std::move(make)};
  return absl::OkStatus();
}

absl::Status PluginRegistry::NotFound(PluginKind kind, const std::string& name) const {
  return absl::InvalidArgumentError(absl::StrCat("unknown ", PluginKindName(kind), " '", name,
                                                 "'; this worker has ",
                                                 absl::StrJoin(Names(kind), ", ")));
}

template <typename Entry>
absl::StatusOr<Entry> PluginRegistry::Find(const std::map<std::string, Entry>& entries,
                                           PluginKind kind, const std::string& name) const {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = entries.find(name);
    if (it != entries.end()) return it->second;
  }
  return NotFound(kind, name);
}

absl::StatusOr<PluginRegistry::StrategyEntry> PluginRegistry::FindStrategy(
    const std::string& name) const {
  return Find(strategies_, PluginKind::kStrategy, name);
}

absl::StatusOr<PluginRegistry::PrecisionEntry> PluginRegistry::FindPrecision(
    const std::string& name) const {
  return Find(precisions_, PluginKind::kPrecision, name);
}

absl::StatusOr<PluginRegistry::AcceleratorEntry> PluginRegistry::FindAccelerator(
    const std::string& name) const {
  return Find(accelerators_, PluginKind::kAccelerator, name);
}

absl::StatusOr<PluginRegistry::CheckpointIOEntry> PluginRegistry::FindCheckpointIO(
    const std::string& name) const {
  return Find(checkpoint_ios_, PluginKind::kCheckpointIO, name);
}

std::vector<PluginInfo> PluginRegistry::List() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<PluginInfo> out;
  for (const auto& [name, e] : accelerators_) out.push_back(e.info);
  for (const auto& [name, e] : precisions_) out.push_back(e.info);
  for (const auto& [name, e] : strategies_) out.push_back(e.info);
  for (const auto& [name, e] : checkpoint_ios_) out.push_back(e.info);
  return out;
}

std::vector<PluginInfo> PluginRegistry::Loaded() const {
  std::vector<PluginInfo> loaded;
  for (PluginInfo& p : List()) {
    if (p.origin != "builtin") loaded.push_back(std::move(p));
  }
  return loaded;
}

std::vector<std::string> PluginRegistry::Names(PluginKind kind) const {
  absl::ReaderMutexLock lock(&mu_);
  switch (kind) {
    case PluginKind::kAccelerator:
      return KeysOf(accelerators_);
    case PluginKind::kPrecision:
      return KeysOf(precisions_);
    case PluginKind::kStrategy:
      return KeysOf(strategies_);
    case PluginKind::kCheckpointIO:
      return KeysOf(checkpoint_ios_);
  }
  return {};
}

absl::Status PluginRegistry::LoadLibrary(const std::string& path) {
  // RTLD_GLOBAL: the library's classes (vtables, typeinfo) must be one with the worker's.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--plugin=", path, ": cannot load: ", dlerror()));
  }
  auto* version = reinterpret_cast<int (*)()>(dlsym(handle, "dtrain_plugin_abi_version"));
  auto* enter =
      reinterpret_cast<void (*)(PluginRegistry&)>(dlsym(handle, "dtrain_register_plugins"));
  if (version == nullptr || enter == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--plugin=", path,
                     ": no dtrain plugin entry point (define one with DTRAIN_PLUGIN, "
                     "worker/plugins/plugin_registry.h)"));
  }
  if (version() != kPluginAbiVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("--plugin=", path, ": built for plugin interface version ", version(),
                     ", this worker has version ", kPluginAbiVersion, "; rebuild it"));
  }
  {
    absl::MutexLock lock(&mu_);
    loading_ = path;
    load_failure_ = absl::OkStatus();
  }
  enter(*this);  // calls back into Add*, which take the lock themselves
  absl::MutexLock lock(&mu_);
  loading_ = "builtin";
  if (!load_failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--plugin=", path, ": ", load_failure_.message()));
  }
  // The handle stays open: the registered factories live in the library.
  return absl::OkStatus();
}

}  // namespace dtrain

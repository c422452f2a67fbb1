// The one registry of the worker's plugins, as Lightning's StrategyRegistry / AcceleratorRegistry:
// accelerators, precision plugins, strategies and checkpoint IO, keyed by the names a job spec
// uses. dtrain's own plugins register through it like anyone else's; `dtrain-worker
// --plugin=lib.so` loads a shared library whose entry point (DTRAIN_PLUGIN below) registers its
// own. The worker reports the plugins it loaded when it registers with the coordinator, which
// refuses a job naming a plugin no worker offers and places a job only on workers offering the
// plugins it names. The interface is docs/extending.md.
//
// The registry sits below the four kinds it holds (it knows them by name only), so each part of
// the worker registers its own into the registry it is given (RegisterBuiltinStrategies in
// worker/strategies/, ...). The Add methods are templates so that a factory's null check is
// compiled where the plugin's type is complete. Global(), the registry with every kind's
// builtins, is defined by the runtime (worker/runtime/registered_plugins.cc), the one part that
// sees all four; nothing below the runtime calls it (tests/check_layering.py checks this).
//
// Thread-safety: thread-safe. Registration happens at startup; lookups at every job's setup.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/plugin_catalog.h"

namespace dtrain {

class Accelerator;
class CheckpointIO;
class CollectiveBackend;
class PrecisionPlugin;
class Strategy;
struct AutocastPlan;
struct DevicePlan;
struct StrategyOptions;
enum class Precision;

// Raised when the plugin interface changes incompatibly; a library built against another
// version is refused at load, naming both. 2: a Strategy's model is private (model(),
// SetModel), so a subclass built against 1 would read the wrong members.
inline constexpr int kPluginAbiVersion = 2;

enum class PluginKind { kAccelerator, kPrecision, kStrategy, kCheckpointIO };
// "accelerator", "precision", "strategy", "checkpoint_io": the job spec's words.
const char* PluginKindName(PluginKind kind);

using StrategyFactory = std::function<absl::StatusOr<std::unique_ptr<Strategy>>(
    const StrategyOptions& options, std::unique_ptr<CollectiveBackend> backend)>;
// `autocast` is what PlanDevices chose for the precision the entry is planned as.
using PrecisionFactory =
    std::function<absl::StatusOr<std::unique_ptr<PrecisionPlugin>>(const AutocastPlan& autocast)>;
// `plan` is PlanDevices' decision for the accelerator the entry is planned as.
using AcceleratorFactory =
    std::function<absl::StatusOr<std::unique_ptr<Accelerator>>(const DevicePlan& plan)>;
using CheckpointIOFactory = std::function<absl::StatusOr<std::unique_ptr<CheckpointIO>>()>;

struct PluginInfo {
  PluginKind kind;
  std::string name;
  std::string description;
  std::string origin;  // "builtin", or the path of the library that registered it
};

class PluginRegistry {
 public:
  struct StrategyEntry {
    PluginInfo info;
    StrategyTraits traits;
    StrategyFactory make;
  };
  struct PrecisionEntry {
    PluginInfo info;
    Precision planned_as;  // what PlanDevices decides devices and autocast for
    PrecisionFactory make;
  };
  struct AcceleratorEntry {
    PluginInfo info;
    std::string planned_as;  // cpu, gpu or auto: what PlanDevices decides devices for
    AcceleratorFactory make;
  };
  struct CheckpointIOEntry {
    PluginInfo info;
    CheckpointIOFactory make;
  };

  // The worker's registry, dtrain's own plugins registered. Defined by the runtime library
  // (worker/runtime/registered_plugins.cc).
  static PluginRegistry& Global();
  // An empty registry (tests).
  PluginRegistry() = default;

  // INVALID_ARGUMENT for a name that is empty or not [a-z0-9_.-]; ALREADY_EXISTS when taken.
  // `make` is a StrategyFactory (PrecisionFactory, ...) or anything that converts to one.
  template <typename Factory>
  absl::Status AddStrategy(const std::string& name, StrategyTraits traits, Factory make,
                           const std::string& description) {
    return InsertStrategy(name, traits,
                          Checked<StrategyFactory>(std::move(make), PluginKind::kStrategy, name),
                          description);
  }
  template <typename Factory>
  absl::Status AddPrecision(const std::string& name, Precision planned_as, Factory make,
                            const std::string& description) {
    return InsertPrecision(name, planned_as,
                           Checked<PrecisionFactory>(std::move(make), PluginKind::kPrecision, name),
                           description);
  }
  template <typename Factory>
  absl::Status AddAccelerator(const std::string& name, const std::string& planned_as, Factory make,
                              const std::string& description) {
    return InsertAccelerator(
        name, planned_as,
        Checked<AcceleratorFactory>(std::move(make), PluginKind::kAccelerator, name), description);
  }
  template <typename Factory>
  absl::Status AddCheckpointIO(const std::string& name, Factory make,
                               const std::string& description) {
    return InsertCheckpointIO(
        name, Checked<CheckpointIOFactory>(std::move(make), PluginKind::kCheckpointIO, name),
        description);
  }

  // INVALID_ARGUMENT naming what is registered when `name` is not. The entries' factories never
  // return null: one that would fails with INTERNAL naming the plugin.
  absl::StatusOr<StrategyEntry> FindStrategy(const std::string& name) const;
  absl::StatusOr<PrecisionEntry> FindPrecision(const std::string& name) const;
  absl::StatusOr<AcceleratorEntry> FindAccelerator(const std::string& name) const;
  absl::StatusOr<CheckpointIOEntry> FindCheckpointIO(const std::string& name) const;

  // Every entry, by kind then name; Loaded(): those a library registered (not "builtin").
  std::vector<PluginInfo> List() const;
  std::vector<PluginInfo> Loaded() const;
  // The names of one kind, sorted.
  std::vector<std::string> Names(PluginKind kind) const;

  // dlopens `path` and calls its dtrain_register_plugins (DTRAIN_PLUGIN). FAILED_PRECONDITION
  // when the library cannot be loaded, has no entry point, was built for another
  // kPluginAbiVersion, or one of its registrations failed (the first failure's message).
  absl::Status LoadLibrary(const std::string& path);

 private:
  // A plugin's factory as the registry hands it out: a factory that returns nothing fails with a
  // status naming the plugin, so no caller needs to check.
  template <typename T, typename... Args>
  static std::function<absl::StatusOr<std::unique_ptr<T>>(Args...)> NeverNull(
      std::function<absl::StatusOr<std::unique_ptr<T>>(Args...)> make, PluginKind kind,
      std::string name) {
    return [make = std::move(make), kind,
            name = std::move(name)](Args... args) -> absl::StatusOr<std::unique_ptr<T>> {
      absl::StatusOr<std::unique_ptr<T>> made = make(std::forward<Args>(args)...);
      if (made.ok() && *made == nullptr) {
        return absl::InternalError(
            absl::StrCat(PluginKindName(kind), " plugin '", name, "' made nothing"));
      }
      return made;
    };
  }
  // `make` as the factory type F, wrapped by NeverNull. A template on `make`'s type, so that it is
  // compiled only where a plugin registers (where the plugin's type is complete).
  template <typename F, typename Make>
  static F Checked(Make make, PluginKind kind, const std::string& name) {
    return NeverNull(F(std::move(make)), kind, name);
  }
  // The Add methods' second half, with the factory already checked.
  absl::Status InsertStrategy(const std::string& name, StrategyTraits traits, StrategyFactory make,
                              const std::string& description);
  absl::Status InsertPrecision(const std::string& name, Precision planned_as, PrecisionFactory make,
                               const std::string& description);
  absl::Status InsertAccelerator(const std::string& name, const std::string& planned_as,
                                 AcceleratorFactory make, const std::string& description);
  absl::Status InsertCheckpointIO(const std::string& name, CheckpointIOFactory make,
                                  const std::string& description);
  absl::Status Check(PluginKind kind, const std::string& name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  PluginInfo Info(PluginKind kind, const std::string& name, const std::string& description) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Added(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotFound(PluginKind kind, const std::string& name) const;
  // The entry `name` of `entries` (one of the maps below, read under mu_), or NotFound.
  template <typename Entry>
  absl::StatusOr<Entry> Find(const std::map<std::string, Entry>& entries, PluginKind kind,
                             const std::string& name) const ABSL_NO_THREAD_SAFETY_ANALYSIS;

  mutable absl::Mutex mu_;
  std::map<std::string, StrategyEntry> strategies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PrecisionEntry> precisions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, AcceleratorEntry> accelerators_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CheckpointIOEntry> checkpoint_ios_ ABSL_GUARDED_BY(mu_);
  // While a library registers: its path (the entries' origin) and its first failure.
  std::string loading_ ABSL_GUARDED_BY(mu_) = "builtin";
  absl::Status load_failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain

// A plugin library's entry point:
//   DTRAIN_PLUGIN(registry) {
//     registry.AddStrategy("recording_ddp", {.distributed = true}, MakeRecordingDdp, "...");
//   }
#define DTRAIN_PLUGIN(registry)                                                      \
  extern "C" int dtrain_plugin_abi_version() { return ::dtrain::kPluginAbiVersion; } \
  extern "C" void dtrain_register_plugins(::dtrain::PluginRegistry& registry)

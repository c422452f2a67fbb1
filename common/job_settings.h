// The one home of every job setting: the names each accepts, its default and its range; the
// one function from a JobSpec to the SetupRequest a worker receives; and the worker's check of a
// SetupRequest by the same rules. NormalizeJobSpec (job_spec.h) checks a spec with these
// constants, the trainer builds SetupRequests with MakeSetupRequest, and worker/runtime/job.cc
// refuses a bad SetupRequest with CheckSetupRequest, so the three cannot drift apart.
//
// Every field of JobSpec is listed in JobSpecFields() with where it goes; job_settings_test walks
// the proto's fields so that a new field cannot be half-added.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

template <typename T>
struct SettingRange {
  T low;
  T high;
  bool Contains(T value) const { return value >= low && value <= high; }
};

// Names a string setting accepts. For a JobSpec, the first is the default.
const std::vector<std::string>& StageNames();              // fit, validate, test, predict
const std::vector<std::string>& StrategyNames();           // ddp, ddp_spawn, sharded, dp, ...
const std::vector<std::string>& PrecisionNames();          // 32-true, 64-true, ... and aliases
const std::vector<std::string>& AcceleratorNames();        // cpu, gpu, cuda, auto
const std::vector<std::string>& CollectiveBackendNames();  // grpc, gloo, shm
const std::vector<std::string>& ClipAlgorithmNames();      // norm, value
const std::vector<std::string>& OptimizerNames();          // sgd, adam, adamw
const std::vector<std::string>& SchedulerNames();          // none, step, cosine
const std::vector<std::string>& BuiltinModelNames();       // mlp, cnn
const std::vector<std::string>& BuiltinDatasetNames();     // fashion-mnist

// Defaults and ranges. A SetupRequest may also carry 0 where it says "the default".
inline constexpr SettingRange<int64_t> kDevicesRange{1, 256};
inline constexpr SettingRange<int64_t> kAccumulateGradBatchesRange{1, 65536};
inline constexpr SettingRange<double> kGradientClipValRange{0, 1e12};
inline constexpr SettingRange<double> kBucketCapMbRange{0.001, 4096};
inline constexpr double kDefaultBucketCapMb = 25;  // torch's
inline constexpr int64_t kDefaultBatchSize = 32;
inline constexpr SettingRange<int64_t> kBatchSizeRange{1, 1 << 20};
inline constexpr int64_t kDefaultValSize = 5000;  // Fashion-MNIST training images held out
inline constexpr SettingRange<int64_t> kBatchesPerCallRange{1, 4096};
inline constexpr SettingRange<int64_t> kNumNodesRange{1, 4096};
inline constexpr int64_t kDefaultMaxRestarts = 3;
inline constexpr SettingRange<int64_t> kMaxRestartsRange{1, 1000};

// The kinds of worker plugins, as a job spec and WorkerInfo.plugins name them: accelerator,
// precision, strategy, checkpoint_io.
const std::vector<std::string>& PluginKindNames();
// Whether `name` can name a plugin: 1 to 64 characters of a-z, 0-9, '_', '-' and '.'.
bool IsPluginName(absl::string_view name);

// Strategies with more than one rank, which join a group on the coordinator: ddp, ddp_spawn,
// sharded, and any plugin strategy (which runs as ddp does).
bool IsDistributedStrategy(absl::string_view strategy);

// What the trainer adds to a spec for one run on its workers.
struct SetupContext {
  std::string job_id;
  std::string coordinator;  // the address workers reach the coordinator at
  std::string group;        // the run's group id
  std::string token;        // the job's token in that group ("": none)
  int world_size = 1;
  absl::Duration register_timeout = absl::Minutes(5);
  // Where rank 0 writes checkpoints: a shared "worker:/dir", or (store_checkpoints) its own
  // directory, sending each file to the coordinator. Neither: the job writes none.
  std::string checkpoint_dir;
  bool store_checkpoints = false;
};

// The Setup a worker receives for a normalized `spec`.
v1::SetupRequest MakeSetupRequest(const v1::JobSpec& spec, const SetupContext& context);

// The worker's check of a Setup, by the rules NormalizeJobSpec applies to a spec. The message
// starts with the request's field path ("devices: ..."). Whether the model, data and optimizer
// load is checked where they are built.
absl::Status CheckSetupRequest(const v1::SetupRequest& request);

// Where each leaf field of JobSpec goes: the SetupRequest field path that carries it to the
// workers, or "" when only the coordinator uses it (its loop, checkpoints, scheduling).
struct JobSpecField {
  std::string spec_path;   // "trainer.devices"
  std::string setup_path;  // "devices"; "" for the coordinator only
};
const std::vector<JobSpecField>& JobSpecFields();

}  // namespace dtrain

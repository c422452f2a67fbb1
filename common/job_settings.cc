#include "common/job_settings.h"

#include "absl/algorithm/container.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

absl::Status Bad(absl::string_view path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

bool OneOf(const std::string& value, const std::vector<std::string>& names) {
  return std::find(names.begin(), names.end(), value) != names.end();
}

// An optional name ("" means the default) from `names`.
absl::Status CheckName(absl::string_view path, const std::string& value,
                       const std::vector<std::string>& names) {
  if (value.empty() || OneOf(value, names)) return absl::OkStatus();
  return Bad(path, absl::StrCat("unknown value '", value, "'; use ", absl::StrJoin(names, ", ")));
}

}  // namespace

const std::vector<std::string>& StageNames() {
  static const auto* names = new std::vector<std::string>{"fit", "validate", "test", "predict"};
  return *names;
}
const std::vector<std::string>& StrategyNames() {
  static const auto* names =
      new std::vector<std::string>{"ddp", "ddp_spawn", "sharded", "dp", "single_device"};
  return *names;
}
const std::vector<std::string>& PrecisionNames() {
  static const auto* names = new std::vector<std::string>{
      "32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "32", "64", "bf16", "16"};
  return *names;
}
const std::vector<std::string>& AcceleratorNames() {
  static const auto* names = new std::vector<std::string>{"cpu", "gpu", "cuda", "auto"};
  return *names;
}
const std::vector<std::string>& CollectiveBackendNames() {
  static const auto* names = new std::vector<std::string>{"auto", "grpc", "gloo", "shm"};
  return *names;
}
const std::vector<std::string>& ClipAlgorithmNames() {
  static const auto* names = new std::vector<std::string>{"norm", "value"};
  return *names;
}
const std::vector<std::string>& OptimizerNames() {
  static const auto* names = new std::vector<std::string>{"sgd", "adam", "adamw"};
  return *names;
}
const std::vector<std::string>& SchedulerNames() {
  static const auto* names = new std::vector<std::string>{"none", "step", "cosine"};
  return *names;
}
const std::vector<std::string>& BuiltinModelNames() {
  static const auto* names = new std::vector<std::string>{"mlp", "cnn"};
  return *names;
}
const std::vector<std::string>& BuiltinDatasetNames() {
  static const auto* names = new std::vector<std::string>{"fashion-mnist"};
  return *names;
}

const std::vector<std::string>& PluginKindNames() {
  static const auto* names =
      new std::vector<std::string>{"accelerator", "precision", "strategy", "checkpoint_io"};
  return *names;
}

bool IsPluginName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return absl::c_all_of(name, [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

bool IsDistributedStrategy(absl::string_view strategy) {
  // A plugin strategy (not one of dtrain's own) runs as ddp does: one rank per worker process.
  return strategy == "ddp" || strategy == "ddp_spawn" || strategy == "sharded" ||
         strategy == "ddp_sharded" ||
         (!strategy.empty() && !absl::c_linear_search(StrategyNames(), strategy));
}

v1::SetupRequest MakeSetupRequest(const v1::JobSpec& spec, const SetupContext& context) {
  const v1::TrainerConfig& t = spec.trainer();
  v1::SetupRequest request;
  request.set_job_id(context.job_id);
  *request.mutable_model() = spec.model();
  *request.mutable_optimizer() = spec.optimizer();
  *request.mutable_lr_scheduler() = spec.lr_scheduler();
  request.set_precision(t.precision());
  request.set_strategy(t.strategy());
  request.set_accelerator(t.accelerator());
  request.set_devices(t.devices());
  request.set_seed(spec.seed_everything());
  request.set_checkpoint_dir(context.checkpoint_dir);
  request.set_store_checkpoints(context.store_checkpoints);
  request.set_checkpoint_io(spec.checkpoint().checkpoint_io());
  *request.mutable_storage_options() = spec.checkpoint().storage_options();
  request.set_accumulate_grad_batches(t.accumulate_grad_batches());
  request.set_gradient_clip_val(t.gradient_clip_val());
  request.set_gradient_clip_algorithm(t.gradient_clip_algorithm());
  request.set_bucket_bytes(static_cast<int64_t>(t.bucket_cap_mb() * (1 << 20)));
  v1::GroupSpec* group = request.mutable_group();
  group->set_coordinator(context.coordinator);
  group->set_group(context.group.empty() ? context.job_id : context.group);
  group->set_token(context.token);
  group->set_world_size(context.world_size);
  group->set_collective_timeout_ms(t.collective_timeout_ms());
  group->set_register_timeout_ms(absl::ToInt64Milliseconds(context.register_timeout));
  group->set_backend(t.collective_backend());
  v1::DataSpec* data = request.mutable_data();
  const v1::DataConfig& d = spec.data();
  switch (d.source_case()) {
    case v1::DataConfig::kBuiltin:
      data->set_builtin(d.builtin());
      break;
    case v1::DataConfig::kSynthetic:
      *data->mutable_synthetic() = d.synthetic();
      break;
    case v1::DataConfig::kTensorsFile:
      data->set_tensors_file(d.tensors_file());
      break;
    case v1::DataConfig::SOURCE_NOT_SET:
      break;
  }
  data->set_data_dir(d.data_dir());
  if (d.has_normalize()) *data->mutable_normalize() = d.normalize();
  data->set_val_size(d.val_size());
  return request;
}

absl::Status CheckSetupRequest(const v1::SetupRequest& request) {
  // The names the worker maps to its kinds (precision, strategy, accelerator) are checked where
  // they are parsed, which also says what this build cannot run (tpu_spawn, a GPU without CUDA).
  if (request.devices() != 0 && !kDevicesRange.Contains(request.devices())) {
    return Bad("devices", absl::StrCat("must be in [", kDevicesRange.low, ", ", kDevicesRange.high,
                                       "] (0: the worker's --devices), got ", request.devices()));
  }
  if (request.accumulate_grad_batches() != 0 &&
      !kAccumulateGradBatchesRange.Contains(request.accumulate_grad_batches())) {
    return Bad("accumulate_grad_batches",
               absl::StrCat("must be in [", kAccumulateGradBatchesRange.low, ", ",
                            kAccumulateGradBatchesRange.high, "] (0: 1), got ",
                            request.accumulate_grad_batches()));
  }
  if (!std::isfinite(request.gradient_clip_val()) ||
      !kGradientClipValRange.Contains(request.gradient_clip_val())) {
    return Bad("gradient_clip_val",
               absl::StrCat("must be in [0, ", kGradientClipValRange.high,
                            "] (0: no clipping), got ", request.gradient_clip_val()));
  }
  if (absl::Status s = CheckName("gradient_clip_algorithm", request.gradient_clip_algorithm(),
                                 ClipAlgorithmNames());
      !s.ok()) {
    return s;
  }
  const double max_bucket_bytes = kBucketCapMbRange.high * (1 << 20);
  if (request.bucket_bytes() < 0 || request.bucket_bytes() > max_bucket_bytes) {
    return Bad("bucket_bytes",
               absl::StrCat("must be in [0, ", max_bucket_bytes, "] (0: ", kDefaultBucketCapMb,
                            " MiB), got ", request.bucket_bytes()));
  }
  if (absl::Status s =
          CheckName("group.backend", request.group().backend(), CollectiveBackendNames());
      !s.ok()) {
    return s;
  }
  if (request.group().world_size() < 0) {
    return Bad("group.world_size",
               absl::StrCat("must be >= 0, got ", request.group().world_size()));
  }
  if (request.group().collective_timeout_ms() < 0) {
    return Bad("group.collective_timeout_ms", "must be >= 0 (0: the coordinator's default)");
  }
  if (request.group().register_timeout_ms() < 0) {
    return Bad("group.register_timeout_ms", "must be >= 0 (0: 5 minutes)");
  }
  if (request.data().val_size() < 0) {
    return Bad("data.val_size", absl::StrCat("must be >= 0 (0: ", kDefaultValSize, "), got ",
                                             request.data().val_size()));
  }
  return absl::OkStatus();
}

const std::vector<JobSpecField>& JobSpecFields() {
  static const auto* fields = new std::vector<JobSpecField>{
      {"name", ""},
      {"model.builtin", "model.builtin"},
      {"model.torchscript", "model.torchscript"},
      {"data.builtin", "data.builtin"},
      {"data.synthetic.train_size", "data.synthetic.train_size"},
      {"data.synthetic.val_size", "data.synthetic.val_size"},
      {"data.synthetic.test_size", "data.synthetic.test_size"},
      {"data.synthetic.seed", "data.synthetic.seed"},
      {"data.tensors_file", "data.tensors_file"},
      {"data.data_dir", "data.data_dir"},
      {"data.val_size", "data.val_size"},
      // The coordinator samples batches and sends indices: the workers never see these.
      {"data.batch_size", ""},
      {"data.eval_batch_size", ""},
      {"data.shuffle", ""},
      {"data.limit_train_samples", ""},
      {"data.limit_val_samples", ""},
      {"data.limit_test_samples", ""},
      {"data.normalize.key", "data.normalize.key"},
      {"data.normalize.mean", "data.normalize.mean"},
      {"data.normalize.std", "data.normalize.std"},
      {"trainer.max_epochs", ""},
      {"trainer.max_steps", ""},
      {"trainer.val_check_interval", ""},
      {"trainer.accumulate_grad_batches", "accumulate_grad_batches"},
      {"trainer.gradient_clip_val", "gradient_clip_val"},
      {"trainer.gradient_clip_algorithm", "gradient_clip_algorithm"},
      {"trainer.strategy", "strategy"},
      {"trainer.precision", "precision"},
      {"trainer.accelerator", "accelerator"},
      {"trainer.devices", "devices"},
      {"trainer.num_nodes", ""},
      {"trainer.collective_timeout_ms", "group.collective_timeout_ms"},
      {"trainer.collective_backend", "group.backend"},
      {"trainer.batches_per_call", ""},
      {"trainer.skip_test", ""},
      {"trainer.log_every_n_steps", ""},
      {"trainer.limit_val_batches", ""},
      {"trainer.bucket_cap_mb", "bucket_bytes"},  // MiB to bytes
      {"trainer.min_nodes", ""},
      {"trainer.max_restarts", ""},
      {"trainer.test_ckpt_path", ""},
      {"optimizer.name", "optimizer.name"},
      {"optimizer.lr", "optimizer.lr"},
      {"optimizer.momentum", "optimizer.momentum"},
      {"optimizer.nesterov", "optimizer.nesterov"},
      {"optimizer.weight_decay", "optimizer.weight_decay"},
      {"optimizer.beta1", "optimizer.beta1"},
      {"optimizer.beta2", "optimizer.beta2"},
      {"optimizer.eps", "optimizer.eps"},
      {"lr_scheduler.name", "lr_scheduler.name"},
      {"lr_scheduler.step_size", "lr_scheduler.step_size"},
      {"lr_scheduler.gamma", "lr_scheduler.gamma"},
      {"lr_scheduler.total_steps", "lr_scheduler.total_steps"},
      {"lr_scheduler.min_lr", "lr_scheduler.min_lr"},
      // Checkpoint files are written through SaveCheckpoint calls with their paths.
      {"checkpoint.every_n_steps", ""},
      {"checkpoint.monitor", ""},
      {"checkpoint.mode", ""},
      {"checkpoint.save_top_k", ""},
      {"checkpoint.dirpath", ""},
      {"checkpoint.checkpoint_io", "checkpoint_io"},
      {"checkpoint.storage_options", "storage_options"},
      {"early_stopping.monitor", ""},
      {"early_stopping.mode", ""},
      {"early_stopping.min_delta", ""},
      {"early_stopping.patience", ""},
      {"ckpt_path", ""},  // through a LoadCheckpoint call
      {"stage", ""},
      {"seed_everything", "seed"},
  };
  return *fields;
}

}  // namespace dtrain

#include "common/job_spec.h"

#include <cmath>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_reference.h"
#include "common/job_settings.h"
#include "common/sha256.h"

namespace dtrain {
namespace {

absl::Status Bad(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

absl::Status OneOf(const std::string& path, std::string* value,
                   const std::vector<std::string>& allowed, const std::string& fallback,
                   const std::string& what) {
  if (value->empty()) *value = fallback;
  for (const std::string& a : allowed) {
    if (*value == a) return absl::OkStatus();
  }
  return Bad(path,
             absl::StrCat("unknown ", what, " '", *value, "'; use ", absl::StrJoin(allowed, ", ")));
}

// A name of dtrain's own, or of a plugin `offered` lists (null: not known here, e.g. in the
// client; the coordinator checks it against its workers).
absl::Status OneOfOrPlugin(const std::string& path, std::string* value,
                           const std::vector<std::string>& allowed, const std::string& fallback,
                           const std::string& kind, const OfferedPlugins* offered) {
  if (value->empty()) *value = fallback;
  if (absl::c_linear_search(allowed, *value)) return absl::OkStatus();
  if (offered == nullptr && IsPluginName(*value)) return absl::OkStatus();
  if (offered != nullptr && offered->count({kind, *value}) > 0) return absl::OkStatus();
  std::vector<std::string> plugins;
  if (offered != nullptr) {
    for (const auto& [key, workers] : *offered) {
      if (key.first == kind) {
        plugins.push_back(absl::StrCat(key.second, " (", absl::StrJoin(workers, ", "), ")"));
      }
    }
  }
  return Bad(path, absl::StrCat(
                       "unknown ", kind, " '", *value, "'; use ", absl::StrJoin(allowed, ", "),
                       plugins.empty() ? std::string(", or a plugin a worker offers (none do now)")
                                       : absl::StrCat(", or a plugin a worker offers: ",
                                                      absl::StrJoin(plugins, ", "))));
}

absl::Status Range(const std::string& path, double value, double low, double high) {
  if (!std::isfinite(value) || value < low || value > high) {
    return Bad(path, absl::StrCat("must be in [", low, ", ", high, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckName(const std::string& name) {
  if (name.size() > 128) return Bad("name", "at most 128 characters");
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return Bad("name",
                 absl::StrCat("'", name, "' may hold only letters, digits, '-', '_' and '.'"));
    }
  }
  return absl::OkStatus();
}

// A file named by content must name it well: the digest becomes a file name on the workers.
absl::Status CheckFileReference(const std::string& path, const std::string& value) {
  if (IsJobFileReference(value)) {
    std::string job, name;
    if (path != "ckpt_path") return Bad(path, "only ckpt_path may name another job's file");
    if (!SplitJobFileReference(value, &job, &name)) {
      return Bad(path, absl::StrCat("'", value,
                                    "' is not a job file; write job:<job id>/<file name>, e.g. "
                                    "job:fashion-cnn-1/last.ckpt (dtrain results JOB lists them)"));
    }
    return absl::OkStatus();
  }
  if (!IsArtifactReference(value)) return absl::OkStatus();
  if (absl::Status s = CheckDigest(ArtifactDigest(value)); !s.ok())
    return Bad(path, std::string(s.message()));
  return absl::OkStatus();
}

absl::Status CheckMode(const std::string& path, std::string* mode, const std::string& monitor) {
  if (mode->empty()) *mode = DefaultMode(monitor);
  if (*mode != "min" && *mode != "max")
    return Bad(path, absl::StrCat("use min or max, got '", *mode, "'"));
  return absl::OkStatus();
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

std::string DefaultMode(const std::string& monitor) {
  return absl::StrContains(monitor, "acc") ? "max" : "min";
}

std::vector<std::pair<std::string, std::string>> PluginsNamedBy(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> named;
  const v1::TrainerConfig& t = spec.trainer();
  if (!t.strategy().empty() && !absl::c_linear_search(StrategyNames(), t.strategy())) {
    named.push_back({"strategy", t.strategy()});
  }
  if (!t.precision().empty() && !absl::c_linear_search(PrecisionNames(), t.precision())) {
    named.push_back({"precision", t.precision()});
  }
  if (!t.accelerator().empty() && !absl::c_linear_search(AcceleratorNames(), t.accelerator())) {
    named.push_back({"accelerator", t.accelerator()});
  }
  const std::string& io = spec.checkpoint().checkpoint_io();
  if (!io.empty() && io != "torch") named.push_back({"checkpoint_io", io});
  return named;
}

int RanksPerWorker(const v1::JobSpec& spec) {
  return spec.trainer().strategy() == "ddp_spawn" ? std::max(1, spec.trainer().devices()) : 1;
}

absl::Status NormalizeJobSpec(v1::JobSpec* spec, const OfferedPlugins* offered) {
  if (spec->name().empty()) spec->set_name("job");
  if (absl::Status s = CheckName(spec->name()); !s.ok()) return s;

  if (absl::Status s =
          OneOf("stage", spec->mutable_stage(), StageNames(), StageNames()[0], "stage");
      !s.ok())
    return s;

  if (absl::Status s = CheckFileReference("ckpt_path", spec->ckpt_path()); !s.ok()) return s;
  v1::ModelSpec* model = spec->mutable_model();
  switch (model->source_case()) {
    case v1::ModelSpec::kBuiltin:
      if (!absl::c_linear_search(BuiltinModelNames(), model->builtin())) {
        return Bad("model.builtin",
                   absl::StrCat("unknown model '", model->builtin(), "'; the zoo has mlp, cnn"));
      }
      break;
    case v1::ModelSpec::kTorchscript:
      if (model->torchscript().empty()) return Bad("model.torchscript", "empty path");
      if (absl::Status s = CheckFileReference("model.torchscript", model->torchscript()); !s.ok())
        return s;
      break;
    default:
      return Bad("model",
                 "give builtin (mlp, cnn) or torchscript (a file saved with torch.jit.save)");
  }

  v1::DataConfig* data = spec->mutable_data();
  switch (data->source_case()) {
    case v1::DataConfig::kBuiltin:
      if (!absl::c_linear_search(BuiltinDatasetNames(), data->builtin())) {
        return Bad("data.builtin", absl::StrCat("unknown dataset '", data->builtin(),
                                                "'; the builtin is fashion-mnist"));
      }
      break;
    case v1::DataConfig::kSynthetic:
      if (data->synthetic().train_size() <= 0)
        return Bad("data.synthetic.train_size", "must be > 0");
      if (data->synthetic().val_size() < 0) return Bad("data.synthetic.val_size", "must be >= 0");
      if (data->synthetic().test_size() < 0) return Bad("data.synthetic.test_size", "must be >= 0");
      break;
    case v1::DataConfig::kTensorsFile:
      if (data->tensors_file().empty()) return Bad("data.tensors_file", "empty path");
      if (absl::Status s = CheckFileReference("data.tensors_file", data->tensors_file()); !s.ok())
        return s;
      break;
    default:
      return Bad("data", "give builtin (fashion-mnist), synthetic or tensors_file");
  }
  if (data->batch_size() == 0) data->set_batch_size(kDefaultBatchSize);
  if (absl::Status s =
          Range("data.batch_size", data->batch_size(), kBatchSizeRange.low, kBatchSizeRange.high);
      !s.ok())
    return s;
  if (data->eval_batch_size() == 0)
    data->set_eval_batch_size(
        static_cast<int32_t>(std::min<int64_t>(4 * data->batch_size(), kBatchSizeRange.high)));
  if (absl::Status s = Range("data.eval_batch_size", data->eval_batch_size(), kBatchSizeRange.low,
                             kBatchSizeRange.high);
      !s.ok())
    return s;
  if (!data->has_shuffle()) data->set_shuffle(true);
  if (data->has_normalize()) {
    if (data->source_case() != v1::DataConfig::kTensorsFile) {
      return Bad("data.normalize",
                 "applies to a tensors_file (the builtin dataset has its own normalization)");
    }
    v1::Normalize* n = data->mutable_normalize();
    if (n->key().empty()) n->set_key("0");
    if (n->mean_size() == 0 || n->mean_size() != n->std_size()) {
      return Bad("data.normalize", "give mean and std, as one value each or one per channel");
    }
    for (int i = 0; i < n->std_size(); ++i) {
      if (!(n->std(i) > 0) || !std::isfinite(n->std(i)) || !std::isfinite(n->mean(i))) {
        return Bad(absl::StrCat("data.normalize.std[", i, "]"), "must be finite and > 0");
      }
    }
  }
  for (const auto& [path, value] :
       {std::pair<std::string, int64_t>{"data.limit_train_samples", data->limit_train_samples()},
        {"data.limit_val_samples", data->limit_val_samples()},
        {"data.limit_test_samples", data->limit_test_samples()},
        {"data.val_size", data->val_size()}}) {
    if (value < 0) return Bad(path, absl::StrCat("must be >= 0, got ", value));
  }

  v1::TrainerConfig* t = spec->mutable_trainer();
  if (t->max_epochs() < 0)
    return Bad("trainer.max_epochs", absl::StrCat("must be >= 0, got ", t->max_epochs()));
  if (t->max_steps() < 0)
    return Bad("trainer.max_steps", absl::StrCat("must be >= 0, got ", t->max_steps()));
  if (t->max_epochs() == 0 && t->max_steps() == 0) t->set_max_epochs(1);
  if (t->max_epochs() == 0) t->set_max_epochs(1 << 20);  // bounded by max_steps
  if (t->val_check_interval() == 0) t->set_val_check_interval(1.0);
  if (absl::Status s = Range("trainer.val_check_interval", t->val_check_interval(), 1e-6, 1e9);
      !s.ok())
    return s;
  if (t->val_check_interval() > 1 &&
      std::floor(t->val_check_interval()) != t->val_check_interval()) {
    return Bad("trainer.val_check_interval",
               "above 1 it counts batches and must be a whole number");
  }
  if (t->accumulate_grad_batches() == 0) t->set_accumulate_grad_batches(1);
  if (absl::Status s = Range("trainer.accumulate_grad_batches", t->accumulate_grad_batches(),
                             kAccumulateGradBatchesRange.low, kAccumulateGradBatchesRange.high);
      !s.ok())
    return s;
  if (absl::Status s = Range("trainer.gradient_clip_val", t->gradient_clip_val(),
                             kGradientClipValRange.low, kGradientClipValRange.high);
      !s.ok())
    return s;
  if (absl::Status s =
          OneOf("trainer.gradient_clip_algorithm", t->mutable_gradient_clip_algorithm(),
                ClipAlgorithmNames(), ClipAlgorithmNames()[0], "clip algorithm");
      !s.ok())
    return s;
  if (t->strategy() == "ddp_sharded") t->set_strategy("sharded");
  if (t->strategy() == "tpu_spawn" || t->strategy() == "xla") {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer.strategy: '", t->strategy(),
                     "' needs an XLA runtime, which libtorch's C++ API does "
                     "not have here; use ddp or ddp_spawn"));
  }
  if (absl::Status s = OneOfOrPlugin("trainer.strategy", t->mutable_strategy(), StrategyNames(),
                                     StrategyNames()[0], "strategy", offered);
      !s.ok())
    return s;
  if (absl::Status s = OneOf("trainer.test_ckpt_path", t->mutable_test_ckpt_path(),
                             {"last", "best"}, "last", "test checkpoint");
      !s.ok())
    return s;
  if (absl::Status s = OneOfOrPlugin("trainer.precision", t->mutable_precision(), PrecisionNames(),
                                     PrecisionNames()[0], "precision", offered);
      !s.ok())
    return s;
  // Refused at submit, not on a worker: no worker here can ever run them.
  if (t->accelerator() == "tpu") {
    return absl::FailedPreconditionError(
        "trainer.accelerator: 'tpu' needs an XLA runtime (torch_xla), which dtrain's libtorch "
        "C++ runtime does not have; use cpu, gpu or auto");
  }
  if (t->accelerator() == "ipu" || t->accelerator() == "hpu" || t->accelerator() == "mps") {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer.accelerator: '", t->accelerator(),
                     "' needs a vendor runtime dtrain's libtorch C++ runtime does not have; use "
                     "cpu, gpu or auto"));
  }
  if (absl::Status s =
          OneOfOrPlugin("trainer.accelerator", t->mutable_accelerator(), AcceleratorNames(),
                        AcceleratorNames()[0], "accelerator", offered);
      !s.ok())
    return s;
  if (t->devices() == 0) t->set_devices(1);
  if (absl::Status s =
          Range("trainer.devices", t->devices(), kDevicesRange.low, kDevicesRange.high);
      !s.ok())
    return s;
  if (t->num_nodes() == 0) t->set_num_nodes(1);
  if (absl::Status s =
          Range("trainer.num_nodes", t->num_nodes(), kNumNodesRange.low, kNumNodesRange.high);
      !s.ok())
    return s;
  if ((t->strategy() == "dp" || t->strategy() == "single_device") && t->num_nodes() != 1) {
    return Bad("trainer.num_nodes",
               absl::StrCat("strategy ", t->strategy(),
                            " runs in one process; use 1 worker or strategy ddp"));
  }
  if (t->min_nodes() == 0) t->set_min_nodes(t->num_nodes());
  if (absl::Status s = Range("trainer.min_nodes", t->min_nodes(), 1, t->num_nodes()); !s.ok()) {
    return s;
  }
  if (t->max_restarts() == 0) t->set_max_restarts(kDefaultMaxRestarts);
  if (absl::Status s = Range("trainer.max_restarts", t->max_restarts(), kMaxRestartsRange.low,
                             kMaxRestartsRange.high);
      !s.ok())
    return s;
  if (t->collective_timeout_ms() < 0) return Bad("trainer.collective_timeout_ms", "must be >= 0");
  if (absl::Status s =
          OneOf("trainer.collective_backend", t->mutable_collective_backend(),
                CollectiveBackendNames(), CollectiveBackendNames()[0], "collective backend");
      !s.ok())
    return s;
  // 0 (the default): sized by the trainer from the time its calls take.
  if (absl::Status s = t->batches_per_call() == 0
                           ? absl::OkStatus()
                           : Range("trainer.batches_per_call", t->batches_per_call(),
                                   kBatchesPerCallRange.low, kBatchesPerCallRange.high);
      !s.ok())
    return s;
  if (t->log_every_n_steps() == 0) t->set_log_every_n_steps(10);
  if (t->log_every_n_steps() < 0) return Bad("trainer.log_every_n_steps", "must be > 0");
  if (t->limit_val_batches() < 0) return Bad("trainer.limit_val_batches", "must be >= 0");
  if (t->bucket_cap_mb() == 0) t->set_bucket_cap_mb(kDefaultBucketCapMb);
  if (absl::Status s = Range("trainer.bucket_cap_mb", t->bucket_cap_mb(), kBucketCapMbRange.low,
                             kBucketCapMbRange.high);
      !s.ok())
    return s;

  v1::OptimizerSpec* o = spec->mutable_optimizer();
  if (absl::Status s = OneOf("optimizer.name", o->mutable_name(), OptimizerNames(),
                             OptimizerNames()[0], "optimizer");
      !s.ok())
    return s;
  if (o->lr() == 0) o->set_lr(0.01);
  if (absl::Status s = Range("optimizer.lr", o->lr(), 1e-12, 1e6); !s.ok()) return s;
  if (absl::Status s = Range("optimizer.momentum", o->momentum(), 0, 0.999999); !s.ok()) return s;
  if (absl::Status s = Range("optimizer.weight_decay", o->weight_decay(), 0, 1e6); !s.ok())
    return s;
  if (o->nesterov() && o->momentum() <= 0) return Bad("optimizer.nesterov", "needs momentum > 0");
  if (absl::Status s = Range("optimizer.beta1", o->beta1(), 0, 0.999999); !s.ok()) return s;
  if (absl::Status s = Range("optimizer.beta2", o->beta2(), 0, 0.999999); !s.ok()) return s;
  if (absl::Status s = Range("optimizer.eps", o->eps(), 0, 1); !s.ok()) return s;

  v1::SchedulerSpec* l = spec->mutable_lr_scheduler();
  if (absl::Status s = OneOf("lr_scheduler.name", l->mutable_name(), SchedulerNames(),
                             SchedulerNames()[0], "lr scheduler");
      !s.ok())
    return s;
  if (l->step_size() < 0) return Bad("lr_scheduler.step_size", "must be > 0");
  if (l->total_steps() < 0)
    return Bad("lr_scheduler.total_steps", "must be >= 0 (0: the whole run)");
  if (absl::Status s = Range("lr_scheduler.gamma", l->gamma(), 0, 1e6); !s.ok()) return s;
  if (l->min_lr() < 0) return Bad("lr_scheduler.min_lr", "must be >= 0");

  v1::CheckpointConfig* c = spec->mutable_checkpoint();
  if (c->every_n_steps() < 0) return Bad("checkpoint.every_n_steps", "must be >= 0");
  if (c->save_top_k() == 0) c->set_save_top_k(1);
  if (c->save_top_k() < 0) return Bad("checkpoint.save_top_k", "must be >= 1");
  if (absl::Status s = CheckMode("checkpoint.mode", c->mutable_mode(), c->monitor()); !s.ok())
    return s;
  // A directory the workers share: marked, so every reader knows it is not the client's.
  if (absl::Status s = OneOfOrPlugin("checkpoint.checkpoint_io", c->mutable_checkpoint_io(),
                                     {"torch"}, "torch", "checkpoint_io", offered);
      !s.ok())
    return s;
  if (!c->dirpath().empty()) {
    if (IsArtifactReference(c->dirpath()) || IsJobFileReference(c->dirpath())) {
      return Bad("checkpoint.dirpath",
                 "names a file; give a directory the workers share (worker:/path), or leave it "
                 "out to keep checkpoints on the coordinator");
    }
    const std::string dir = WithoutWorkerMark(c->dirpath());
    if (dir.empty() || dir[0] != '/') {
      return Bad("checkpoint.dirpath",
                 absl::StrCat("'", c->dirpath(),
                              "' is not an absolute path on the workers; give worker:/path, or "
                              "leave it out to keep checkpoints on the coordinator"));
    }
    c->set_dirpath(absl::StrCat(kWorkerPathPrefix, dir));
  }

  v1::EarlyStoppingConfig* e = spec->mutable_early_stopping();
  if (e->patience() == 0) e->set_patience(3);
  if (e->patience() < 0) return Bad("early_stopping.patience", "must be >= 1");
  if (e->min_delta() < 0) return Bad("early_stopping.min_delta", "must be >= 0");
  if (absl::Status s = CheckMode("early_stopping.mode", e->mutable_mode(), e->monitor()); !s.ok())
    return s;
  return absl::OkStatus();
}

}  // namespace dtrain

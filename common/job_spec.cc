#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint_filename.h"
#include "common/file_reference.h"
#include "common/job_settings.h"
#include "common/sha256.h"

namespace dtrain {
namespace {

// Whether `m` sets a field other than `skip` to something other than zero and its default: a
// normalized spec has its defaults filled in, so normalizing it again finds nothing set.
bool SetsAnything(const google::protobuf::Message& m, const google::protobuf::Message& defaults,
                  const std::string& skip) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->name() == skip || f->is_repeated() || !r->HasField(m, f)) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_DOUBLE:
        if (r->GetDouble(m, f) != r->GetDouble(defaults, f)) return true;
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        if (r->GetInt64(m, f) != r->GetInt64(defaults, f)) return true;
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        if (r->GetBool(m, f) != r->GetBool(defaults, f)) return true;
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (r->GetString(m, f) != r->GetString(defaults, f)) return true;
        break;
      default:
        return true;
    }
  }
  return false;
}

absl::Status BadSpec(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

absl::Status CheckName(const std::string& name) {
  if (name.size() > 128) return BadSpec("name", "at most 128 characters");
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return BadSpec("name",
                     absl::StrCat("'", name, "' may hold only letters, digits, '-', '_' and '.'"));
    }
  }
  return absl::OkStatus();
}

// A file named by content must name it well: the digest becomes a file name on the workers.
absl::Status CheckFileReference(const SpecPath& p) {
  if (IsJobFileReference(p.value)) {
    std::string job, name;
    if (p.kind != v1::Setting::CHECKPOINT) {
      return BadSpec(p.path, "only ckpt_path may name another job's file");
    }
    if (!SplitJobFileReference(p.value, &job, &name)) {
      return BadSpec(p.path,
                     absl::StrCat("'", p.value,
                                  "' is not a job file; write job:<job id>/<file name>, e.g. "
                                  "job:fashion-cnn-1/last.ckpt (dtrain results JOB lists them)"));
    }
    return absl::OkStatus();
  }
  if (!IsArtifactReference(p.value)) return absl::OkStatus();
  if (absl::Status s = CheckDigest(ArtifactDigest(p.value)); !s.ok()) {
    return BadSpec(p.path, std::string(s.message()));
  }
  return absl::OkStatus();
}

// A directory every worker shares, as an absolute path marked "worker:", so every reader knows
// it is not the client's.
absl::Status MarkSharedDirectory(std::string* dirpath) {
  if (dirpath->empty()) return absl::OkStatus();
  if (IsArtifactReference(*dirpath) || IsJobFileReference(*dirpath)) {
    return BadSpec("checkpoint.dirpath",
                   "names a file; give a directory the workers share (worker:/path), or leave it "
                   "out to keep checkpoints on the coordinator");
  }
  const std::string dir = WithoutWorkerMark(*dirpath);
  if (dir.empty() || dir[0] != '/') {
    return BadSpec("checkpoint.dirpath",
                   absl::StrCat("'", *dirpath,
                                "' is not an absolute path on the workers; give worker:/path, or "
                                "leave it out to keep checkpoints on the coordinator"));
  }
  *dirpath = absl::StrCat(kWorkerPathPrefix, dir);
  return absl::OkStatus();
}

// The text at a setting's `path` in `spec` ("" when a message on the way is unset).
std::string TextAt(const v1::JobSpec& spec, const std::string& path) {
  const google::protobuf::Message* m = &spec;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    m = &m->GetReflection()->GetMessage(*m, f);
  }
  const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts.back());
  return m->GetReflection()->GetString(*m, f);
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
  for (const JobSetting& s : JobSettings()) {
    const std::string& kind = s.setting->plugin_kind();
    if (kind.empty()) continue;
    const std::string name = TextAt(spec, s.path);
    if (!name.empty() && FindInCatalog(kind, name) == nullptr) named.push_back({kind, name});
  }
  return named;
}

int RanksPerWorker(const v1::JobSpec& spec) {
  return StrategyTraitsOf(spec.trainer().strategy()).spawns_per_device
             ? std::max(1, spec.trainer().devices())
             : 1;
}

namespace {

// Lightning's fast_dev_run and overfit_batches, which set other flags as Lightning's
// _init_debugging_flags does: the run then reads only those.
absl::Status ApplyLightningDebugFlags(v1::JobSpec* spec) {
  v1::TrainerConfig* t = spec->mutable_trainer();
  const bool overfit = (t->has_overfit_batches() && t->overfit_batches() > 0) ||
                       (t->has_overfit_fraction() && t->overfit_fraction() > 0);
  if (const int32_t n = t->fast_dev_run(); n > 0) {
    if (!overfit) {
      t->set_limit_train_batches(n);
      t->set_limit_val_batches(n);
    }
    t->set_limit_test_batches(n);
    t->set_limit_predict_batches(n);
    t->set_max_steps(n);
    t->set_max_epochs(1);
    t->set_num_sanity_val_steps(0);
    t->set_val_check_interval(1.0);
    t->set_check_val_every_n_epoch(1);
  }
  if (!overfit) return absl::OkStatus();
  if (t->has_overfit_batches()) {
    t->set_limit_train_batches(t->overfit_batches());
    t->set_limit_val_batches(t->overfit_batches());
  } else {
    t->set_limit_train_fraction(t->overfit_fraction());
    t->set_limit_val_fraction(t->overfit_fraction());
  }
  // The same batches every epoch, as Lightning replaces the training sampler by a sequential one
  // (for shards: their order and the sample shuffle buffer).
  spec->mutable_data()->set_shuffle(false);
  if (spec->data().has_shards()) spec->mutable_data()->mutable_shards()->set_shuffle_buffer(0);
  return absl::OkStatus();
}

}  // namespace

absl::Status NormalizeJobSpec(v1::JobSpec* spec, const OfferedPlugins* offered) {
  // Lightning's strategy "auto", resolved as Lightning resolves it for this many processes
  // (before the catalog check, which knows concrete strategies only).
  if (spec->trainer().strategy() == "auto") {
    v1::TrainerConfig* t = spec->mutable_trainer();
    t->set_strategy(t->devices() > 1 ? "ddp_spawn" : t->num_nodes() > 1 ? "ddp" : "single_device");
  }
  // A spec that sets anything of its optimizer, or a schedule, trains with its own optimizer
  // (sgd unless named); only one with neither leaves it to the model's configure_optimizers.
  if (spec->optimizer().name().empty() &&
      (SetsAnything(spec->optimizer(), JobSpecDefaults().optimizer(), "name") ||
       (!spec->lr_scheduler().name().empty() && spec->lr_scheduler().name() != "none") ||
       (spec->lr_scheduler().name().empty() &&
        SetsAnything(spec->lr_scheduler(), JobSpecDefaults().lr_scheduler(), "name")))) {
    spec->mutable_optimizer()->set_name("sgd");
  }
  if (absl::Status s = ApplySettings(spec, offered); !s.ok()) return s;

  // The rules no single field's option can say.
  if (absl::Status s = CheckName(spec->name()); !s.ok()) return s;
  if (spec->model().source_case() == v1::ModelSpec::SOURCE_NOT_SET) {
    return BadSpec(
        "model", absl::StrCat("give builtin (", absl::StrJoin(SettingNames("model.builtin"), ", "),
                              ") or torchscript (a file saved with torch.jit.save)"));
  }
  if (spec->data().source_case() == v1::DataConfig::SOURCE_NOT_SET) {
    return BadSpec("data",
                   absl::StrCat("give builtin (", absl::StrJoin(SettingNames("data.builtin"), ", "),
                                "), synthetic, tensors_file or shards"));
  }
  for (const SpecPath& p : SpecPaths(*spec)) {
    if (p.kind == v1::Setting::DIRECTORY) continue;
    if (p.kind == v1::Setting::SHARDS && !IsArtifactReference(p.value)) {
      continue;  // a pattern, directory or list (the client's until uploaded), or a URL
    }
    if (absl::Status s = CheckFileReference(p); !s.ok()) return s;
  }

  v1::DataConfig* data = spec->mutable_data();
  if (data->eval_batch_size() == 0) {
    const double most = FindJobSetting("data.eval_batch_size")->setting->max();
    data->set_eval_batch_size(
        static_cast<int32_t>(std::min<double>(4.0 * data->batch_size(), most)));
  }
  if (data->has_shards()) {
    const v1::ShardDataSpec& sh = data->shards();
    if (sh.train().empty() && sh.predict().empty()) {
      return BadSpec("data.shards",
                     "give train (or predict, for predict only): a pattern such "
                     "as worker:/data/train-{000000..000099}.tar, a directory or "
                     "a list file");
    }
    if (sh.fields().empty()) {
      return BadSpec("data.shards.fields",
                     "name the fields that make a batch, e.g. [{name: jpg, type: image}, {name: "
                     "cls, type: int}]");
    }
    // A list's entries are not reached by the fields' own Setting options: checked here, so a
    // typo is refused at submit rather than by the workers at set-up.
    const std::vector<std::string> types = SettingNames("data.shards.fields.type");
    for (int i = 0; i < sh.fields_size(); ++i) {
      const v1::ShardField& f = sh.fields(i);
      const std::string at = absl::StrCat("data.shards.fields[", i, "]");
      if (absl::StripAsciiWhitespace(f.name()).empty()) {
        return BadSpec(absl::StrCat(at, ".name"),
                       "give the field's extension in the shards (jpg, cls, npy, ...)");
      }
      if (!f.type().empty() && std::find(types.begin(), types.end(), f.type()) == types.end()) {
        return BadSpec(
            absl::StrCat(at, ".type"),
            absl::StrCat("unknown field type '", f.type(), "'; use ", absl::StrJoin(types, ", "),
                         ", or leave it empty for the "
                         "extension's"));
      }
    }
  }
  if (data->has_normalize()) {
    if (data->source_case() != v1::DataConfig::kTensorsFile) {
      return BadSpec("data.normalize",
                     "applies to a tensors_file (the builtin dataset has its own normalization)");
    }
    const v1::Normalize& n = data->normalize();
    if (n.mean_size() == 0 || n.mean_size() != n.std_size()) {
      return BadSpec("data.normalize", "give mean and std, as one value each or one per channel");
    }
    for (int i = 0; i < n.std_size(); ++i) {
      if (!(n.std(i) > 0) || !std::isfinite(n.std(i)) || !std::isfinite(n.mean(i))) {
        return BadSpec(absl::StrCat("data.normalize.std[", i, "]"), "must be finite and > 0");
      }
    }
  }

  v1::TrainerConfig* t = spec->mutable_trainer();
  if (absl::Status s = ApplyLightningDebugFlags(spec); !s.ok()) return s;
  if (t->devices() == 0) {
    // devices: auto. Lightning's CPU accelerator counts one device; a GPU worker's count is not
    // something the coordinator places jobs by.
    if (t->accelerator() == "gpu" || t->accelerator() == "cuda") {
      return BadSpec("trainer.devices",
                     "auto on gpu is not resolved by dtrain: give the number of GPUs each worker "
                     "runs (its --devices)");
    }
    t->set_devices(1);
  }
  if (t->max_steps() < 0) t->set_max_steps(0);  // Lightning's -1: no limit, as 0
  if (t->max_epochs() < 0) t->set_max_epochs(kNoEpochLimit);
  if (t->max_epochs() == 0) {
    t->set_max_epochs(t->max_steps() == 0 ? kLightningDefaultEpochs : kNoEpochLimit);
  }
  if (t->val_check_interval() > 1 &&
      std::floor(t->val_check_interval()) != t->val_check_interval()) {
    return BadSpec("trainer.val_check_interval",
                   "above 1 it counts batches and must be a whole number");
  }
  if (!StrategyTraitsOf(t->strategy()).distributed && t->num_nodes() != 1) {
    return BadSpec("trainer.num_nodes",
                   absl::StrCat("strategy ", t->strategy(),
                                " runs in one process; use 1 worker or strategy ddp"));
  }
  if (const int64_t ranks = int64_t{t->num_nodes()} * RanksPerWorker(*spec);
      ranks > kMostGroupRanks) {
    return BadSpec("trainer.num_nodes",
                   absl::StrCat(t->num_nodes(), " workers of ", RanksPerWorker(*spec),
                                " ranks each (trainer.devices under ", t->strategy(), ") make ",
                                ranks, " ranks; a group holds at most ", kMostGroupRanks));
  }
  if (t->min_nodes() == 0) t->set_min_nodes(t->num_nodes());
  if (t->min_nodes() > t->num_nodes()) {
    return BadSpec("trainer.min_nodes",
                   absl::StrCat("must be in [1, ", t->num_nodes(), "] (at most num_nodes), got ",
                                t->min_nodes()));
  }

  const v1::OptimizerSpec& o = spec->optimizer();
  if (o.nesterov() && o.momentum() <= 0) return BadSpec("optimizer.nesterov", "needs momentum > 0");

  v1::CheckpointConfig* c = spec->mutable_checkpoint();
  if (c->mode().empty()) c->set_mode(DefaultMode(c->monitor()));
  if (absl::Status s = ValidateCheckpointFilename(c->filename()); !s.ok()) return s;
  if (absl::Status s = MarkSharedDirectory(c->mutable_dirpath()); !s.ok()) return s;
  v1::EarlyStoppingConfig* e = spec->mutable_early_stopping();
  if (e->mode().empty()) e->set_mode(DefaultMode(e->monitor()));
  return absl::OkStatus();
}

}  // namespace dtrain

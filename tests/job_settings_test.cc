// The one home of job settings: the Setting option on every field of JobSpec (job_spec.proto),
// read by common/job_settings.h. Every leaf field has one, with a side, and its default, range
// and names agree with each other; NormalizeJobSpec applies them; MakeSetupRequest carries
// exactly the worker-side fields to the workers and no other; NormalizeSetupRequest, the
// worker's check, accepts what a normalized spec produces (changing nothing) and refuses what
// the spec refuses, naming the field. A field added to job_spec.proto without its option fails
// here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/message_differencer.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_settings.h"
#include "common/job_spec.h"
#include "common/plugin_catalog.h"
#include "common/setup_request.h"

namespace dtrain {
namespace job_settings_test {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The message holding `path`'s last field, and that field.
std::pair<Message*, const FieldDescriptor*> Resolve(Message* root, const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  Message* m = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    m = m->GetReflection()->MutableMessage(m, f);
  }
  return {m, m->GetDescriptor()->FindFieldByName(parts.back())};
}

// Sets `path` to a value no default has; returns it as text.
std::string SetDistinct(Message* root, const std::string& path) {
  auto [m, f] = Resolve(root, path);
  const google::protobuf::Reflection* r = m->GetReflection();
  if (f->is_map()) {  // map<string, string>: one entry
    Message* entry = r->AddMessage(m, f);
    entry->GetReflection()->SetString(entry, entry->GetDescriptor()->FindFieldByName("key"), "k");
    entry->GetReflection()->SetString(entry, entry->GetDescriptor()->FindFieldByName("value"),
                                      "distinct-" + path);
    return "k=distinct-" + path;
  }
  if (f->is_repeated()) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE) {
      ADD_FAILURE() << path << " is a list of a type this test does not set";
      return "";
    }
    r->AddDouble(m, f, 0.5);
    return "0.5";
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(m, f, "distinct-" + path);
      return "distinct-" + path;
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(m, f, 7);
      return "7";
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(m, f, 7);
      return "7";
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(m, f, 7);
      return "7";
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(m, f, 0.5);
      return "0.5";
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(m, f, !r->GetBool(*m, f));
      return r->GetBool(*m, f) ? "true" : "false";
    default:
      ADD_FAILURE() << path << " has a type this test does not set";
      return "";
  }
}

std::string Get(Message* root, const std::string& path) {
  auto [m, f] = Resolve(root, path);
  const google::protobuf::Reflection* r = m->GetReflection();
  std::ostringstream out;
  if (f->is_map()) {
    for (int i = 0; i < r->FieldSize(*m, f); ++i) {
      const Message& entry = r->GetRepeatedMessage(*m, f, i);
      const google::protobuf::Reflection* er = entry.GetReflection();
      out << er->GetString(entry, entry.GetDescriptor()->FindFieldByName("key")) << "="
          << er->GetString(entry, entry.GetDescriptor()->FindFieldByName("value"));
    }
    return out.str();
  }
  if (f->is_repeated()) {
    for (int i = 0; i < r->FieldSize(*m, f); ++i) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) out << r->GetRepeatedDouble(*m, f, i);
    }
    return out.str();
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(*m, f);
    case FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(r->GetInt32(*m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(r->GetInt64(*m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(r->GetUInt64(*m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out << r->GetDouble(*m, f);
      return out.str();
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(*m, f) ? "true" : "false";
    default:
      return "";
  }
}

// Sets a number field to `value` (cast to its type).
void SetNumber(Message* root, const std::string& path, double value) {
  auto [m, f] = Resolve(root, path);
  const google::protobuf::Reflection* r = m->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(m, f, static_cast<int32_t>(value));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(m, f, static_cast<int64_t>(value));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(m, f, static_cast<uint64_t>(value));
      break;
    default:
      r->SetDouble(m, f, value);
  }
}

bool IsNumber(const FieldDescriptor* f) {
  return f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ||
         f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
         f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64 ||
         f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE;
}

v1::JobSpec Normalized() {
  v1::JobSpec spec;
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  EXPECT_TRUE(NormalizeJobSpec(&spec).ok());
  return spec;
}

// A normalized spec in which `path` is set up: streamed shards when it is under data.shards (a
// choice of data's oneof), the synthetic data otherwise.
v1::JobSpec NormalizedFor(const std::string& path) {
  if (path.rfind("data.shards.", 0) != 0) return Normalized();
  v1::JobSpec spec;
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_shards()->set_train("worker:/data/train-{0..1}.tar");
  spec.mutable_data()->mutable_shards()->add_fields()->set_name("npy");
  EXPECT_TRUE(NormalizeJobSpec(&spec).ok());
  return spec;
}

// Whether `path` runs through a list of messages (data.shards.fields.type, a transform's
// field): such a leaf has no single place to set, and only rules in code check it.
bool InList(const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  const google::protobuf::Descriptor* d = v1::JobSpec::descriptor();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = d->FindFieldByName(parts[i]);
    if (f == nullptr || f->is_repeated()) return true;
    d = f->message_type();
  }
  return false;
}

SetupContext Context() {
  SetupContext c;
  c.job_id = "job-1";
  c.coordinator = "127.0.0.1:1";
  c.group = "job-1.2";
  c.token = "t";
  c.world_size = 4;
  return c;
}

// The guarantee that a setting cannot be half-added: every leaf field under JobSpec states its
// rules in one Setting option, whose parts agree.
TEST(JobSettingsTest, EveryLeafField_HasAConsistentSettingOption) {
  ASSERT_GT(JobSettings().size(), 60u);
  for (const JobSetting& s : JobSettings()) {
    const v1::Setting& o = *s.setting;
    EXPECT_NE(o.side(), v1::Setting::SIDE_UNSPECIFIED)
        << s.path << ": give it a [(setting) = {side: ...}] option in job_spec.proto";
    if (o.has_min() && o.has_max()) {
      EXPECT_LE(o.min(), o.max()) << s.path;
    }
    if (o.has_min() || o.has_max()) {
      EXPECT_TRUE(IsNumber(s.field)) << s.path << ": a range";
    }
    if (o.names_size() > 0 || !o.plugin_kind().empty() || o.path() != v1::Setting::NOT_A_PATH) {
      EXPECT_EQ(s.field->cpp_type(), FieldDescriptor::CPPTYPE_STRING) << s.path;
    }
    if (!o.plugin_kind().empty()) {
      EXPECT_TRUE(absl::c_linear_search(PluginKindNames(), o.plugin_kind())) << s.path;
      EXPECT_EQ(o.names_size(), 0) << s.path << ": names come from the plugin catalog";
    }
    // A text that must be one of some names is never left empty by an empty spec, unless it
    // belongs to a oneof (only checked when chosen) or says what "" means.
    if (o.names_size() > 0 || !o.plugin_kind().empty()) {
      EXPECT_TRUE(!o.default_value().empty() || !o.zero_means().empty() ||
                  s.field->real_containing_oneof() != nullptr)
          << s.path;
    }
    if (!o.default_value().empty()) {
      EXPECT_FALSE(s.field->is_repeated()) << s.path << ": a list has no default";
      // The default is what the defaults spec holds, and it passes the field's own rules.
      v1::JobSpec spec;
      spec.mutable_model()->set_builtin("mlp");
      spec.mutable_data()->mutable_synthetic()->set_train_size(1);
      ASSERT_TRUE(ApplySettings(&spec).ok()) << s.path;
      v1::JobSpec defaults = JobSpecDefaults();
      if (s.field->real_containing_oneof() == nullptr && s.path.rfind("data.normalize.", 0) != 0) {
        EXPECT_EQ(Get(&spec, s.path), Get(&defaults, s.path)) << s.path;
      }
    }
    for (const v1::Setting::Replaced& r : o.replaces()) {
      EXPECT_EQ(FindJobSetting(r.key()), nullptr) << r.key() << " is a setting again";
      // A renamed key's hint names the new one; a Lightning argument dtrain lacks names the
      // nearest setting, or says it is not supported or to remove it.
      const bool says = absl::StrContains(r.hint(), s.path) ||
                        absl::StrContains(r.hint(), "not supported") ||
                        absl::StrContains(r.hint(), "remove it");
      EXPECT_TRUE(says) << r.key() << ": the hint names the new key: " << r.hint();
    }
  }
}

TEST(JobSettingsTest, Defaults_ComeFromTheOptions) {
  for (const JobSetting& s : JobSettings()) {
    if (s.setting->default_value().empty() || s.field->real_containing_oneof() != nullptr ||
        s.path.rfind("data.normalize.", 0) == 0 || InList(s.path)) {
      continue;
    }
    v1::JobSpec spec = NormalizedFor(s.path);
    std::string expected = s.setting->default_value();
    if (IsNumber(s.field)) {  // "1.0" and "1" both print as 1
      std::ostringstream out;
      out << std::stod(expected);
      expected = out.str();
    }
    EXPECT_EQ(Get(&spec, s.path), expected) << s.path;
  }
  // The examples the issue asks about: one home each.
  const v1::JobSpec spec = Normalized();
  EXPECT_EQ(spec.trainer().bucket_cap_mb(), 25);
  EXPECT_EQ(spec.trainer().strategy(), "ddp");
  EXPECT_EQ(spec.data().eval_batch_size(), 4 * spec.data().batch_size());  // a rule in code
}

// Code outside the spec's parser reads some options' bounds (the worker bounds every batch a
// call names by MostBatchRows): they exist, and both batch sizes share the one bound.
TEST(JobSettingsTest, BoundsReadElsewhere_Exist) {
  for (const char* path : {"data.batch_size", "data.eval_batch_size"}) {
    const JobSetting* setting = FindJobSetting(path);
    ASSERT_NE(setting, nullptr) << path;
    EXPECT_TRUE(setting->setting->has_max()) << path;
    EXPECT_EQ(setting->setting->max(), 1048576) << path;
    EXPECT_EQ(static_cast<int64_t>(setting->setting->max()), MostBatchRows()) << path;
  }
}

TEST(JobSettingsTest, PathsAndOldKeys_FromTheOptions) {
  std::map<std::string, v1::Setting::PathKind> paths;
  for (const JobSetting& s : JobSettings()) {
    if (s.setting->path() != v1::Setting::NOT_A_PATH) paths[s.path] = s.setting->path();
  }
  EXPECT_EQ(paths, (std::map<std::string, v1::Setting::PathKind>{
                       {"model.torchscript", v1::Setting::FILE},
                       {"data.tensors_file", v1::Setting::FILE},
                       {"data.data_dir", v1::Setting::DIRECTORY},
                       {"checkpoint.dirpath", v1::Setting::DIRECTORY},
                       {"ckpt_path", v1::Setting::CHECKPOINT},
                       {"data.shards.train", v1::Setting::SHARDS},
                       {"data.shards.val", v1::Setting::SHARDS},
                       {"data.shards.test", v1::Setting::SHARDS},
                       {"data.shards.predict", v1::Setting::SHARDS},
                       {"data.transforms.script", v1::Setting::FILE}}));
  v1::JobSpec spec;
  spec.mutable_model()->set_torchscript("m.pt");
  spec.mutable_data()->set_builtin("fashion-mnist");
  spec.mutable_data()->set_data_dir("worker:/d");
  spec.set_ckpt_path("job:a/last.ckpt");
  std::vector<std::string> found;
  for (const SpecPath& p : SpecPaths(spec)) found.push_back(p.path + "=" + p.value);
  EXPECT_EQ(found, (std::vector<std::string>{"model.torchscript=m.pt", "data.data_dir=worker:/d",
                                             "ckpt_path=job:a/last.ckpt"}));
  ASSERT_TRUE(RewriteSpecPaths(&spec, [](SpecPath* p) {
                p->value = "/x/" + p->path;
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(spec.model().torchscript(), "/x/model.torchscript");
  EXPECT_EQ(spec.ckpt_path(), "/x/ckpt_path");
  EXPECT_TRUE(spec.data().has_builtin()) << "a oneof's other member is left alone";

  // 4 keys dtrain once spelled differently, and the 16 Lightning Trainer arguments it lacks
  // (tests/python/test_settings.py lists them and checks each message from both parsers).
  EXPECT_EQ(ReplacedKeys().size(), 4u + 16u);
  EXPECT_THAT(ReplacedKeys().at("trainer.logger"), HasSubstr("dtrain always logs"));
  EXPECT_THAT(ReplacedKeys().at("trainer.num_workers"), StartsWith("renamed to trainer.num_nodes"));
  EXPECT_THAT(ReplacedKeys().at("resume_from"), StartsWith("renamed to ckpt_path"));
}

TEST(JobSettingsTest, MakeSetupRequest_CarriesTheWorkersSettingsAndNoOther) {
  for (const JobSetting& s : JobSettings()) {
    if (InList(s.path)) continue;
    const v1::SetupRequest base = MakeSetupRequest(NormalizedFor(s.path), Context());
    v1::JobSpec spec = NormalizedFor(s.path);
    const std::string value = SetDistinct(&spec, s.path);
    v1::SetupRequest request = MakeSetupRequest(spec, Context());
    if (s.setting->side() == v1::Setting::WORKERS) {
      EXPECT_EQ(Get(request.mutable_spec(), s.path), value) << s.path;
    } else {
      // The stage decides whether the job writes checkpoints (below); nothing else changes.
      EXPECT_TRUE(MessageDifferencer::Equals(request.spec(), base.spec()))
          << s.path << " is the coordinator's only, but reached the workers";
    }
  }
}

TEST(JobSettingsTest, MakeSetupRequest_OnlyFitWritesCheckpoints) {
  v1::JobSpec spec = Normalized();
  v1::SetupRequest fit = MakeSetupRequest(spec, Context());
  EXPECT_TRUE(fit.store_checkpoints());
  EXPECT_EQ(fit.spec().checkpoint().dirpath(), "");
  spec.mutable_checkpoint()->set_dirpath("/shared");
  ASSERT_TRUE(NormalizeJobSpec(&spec).ok());
  fit = MakeSetupRequest(spec, Context());
  EXPECT_FALSE(fit.store_checkpoints());
  EXPECT_EQ(fit.spec().checkpoint().dirpath(), "worker:/shared");
  spec.set_stage("test");
  const v1::SetupRequest test = MakeSetupRequest(spec, Context());
  EXPECT_FALSE(test.store_checkpoints());
  EXPECT_EQ(test.spec().checkpoint().dirpath(), "");
  EXPECT_EQ(test.spec().stage(), "") << "the stage is the coordinator's";
}

TEST(JobSettingsTest, MakeSetupRequest_GroupFromTheContext) {
  const v1::SetupRequest r = MakeSetupRequest(Normalized(), Context());
  EXPECT_EQ(r.job_id(), "job-1");
  EXPECT_EQ(r.group().group(), "job-1.2");
  EXPECT_EQ(r.group().coordinator(), "127.0.0.1:1");
  EXPECT_EQ(r.group().token(), "t");
  EXPECT_EQ(r.group().world_size(), 4);
  EXPECT_EQ(r.group().register_timeout_ms(), 300000);
  EXPECT_EQ(r.spec().data().synthetic().train_size(), 64);
  EXPECT_EQ(r.spec().data().batch_size(), 0) << "the coordinator samples the batches";
}

// What the coordinator sends passes the worker's check unchanged, at every range's ends.
TEST(JobSettingsTest, NormalizeSetupRequest_AcceptsWhatSpecsProduce_AtTheirLimits) {
  for (const JobSetting& s : JobSettings()) {
    if (s.setting->side() != v1::Setting::WORKERS || s.field->real_containing_oneof() != nullptr ||
        InList(s.path)) {
      continue;
    }
    for (bool high : {false, true}) {
      if (high ? !s.setting->has_max() : !s.setting->has_min()) continue;
      v1::JobSpec spec = NormalizedFor(s.path);
      SetNumber(&spec, s.path, high ? s.setting->max() : s.setting->min());
      ASSERT_TRUE(NormalizeJobSpec(&spec).ok()) << s.path;
      const v1::SetupRequest sent = MakeSetupRequest(spec, Context());
      v1::SetupRequest checked = sent;
      const absl::Status status = NormalizeSetupRequest(&checked);
      EXPECT_TRUE(status.ok()) << s.path << ": " << status;
      EXPECT_TRUE(MessageDifferencer::Equals(checked, sent)) << s.path;
    }
  }
  for (const std::string& backend : SettingNames("trainer.collective_backend")) {
    v1::JobSpec spec = Normalized();
    spec.mutable_trainer()->set_collective_backend(backend);
    v1::SetupRequest request = MakeSetupRequest(spec, Context());
    EXPECT_TRUE(NormalizeSetupRequest(&request).ok()) << backend;
  }
  // A hand-written Setup may leave settings unset: the spec's defaults.
  v1::SetupRequest hand;
  hand.mutable_spec()->mutable_model()->set_builtin("mlp");
  hand.mutable_spec()->mutable_data()->mutable_synthetic()->set_train_size(8);
  ASSERT_TRUE(NormalizeSetupRequest(&hand).ok());
  EXPECT_EQ(hand.spec().trainer().strategy(), "ddp");
  EXPECT_EQ(hand.spec().trainer().bucket_cap_mb(), 25);
  EXPECT_EQ(hand.spec().data().batch_size(), 0) << "the coordinator's settings stay cleared";
}

// A plain proto3 number cannot tell an explicit 0 from an unset field, so a default would
// replace a 0 the user wrote. Where 0 is allowed and the default is not 0, the field must be
// `optional` (with presence), as data.num_workers (0: decode on the step's thread) and
// data.shards.shuffle_buffer (0: no sample shuffle) are.
TEST(JobSettingsTest, ExplicitZero_KeptWhereTheRangeAllowsIt) {
  // Still plain fields, found with this test (Adam's beta1 = 0 becomes 0.9, val_size 0 becomes
  // 5,000); not the data stream's to change.
  const std::set<std::string> known = {"optimizer.beta1", "optimizer.beta2", "optimizer.eps",
                                       "lr_scheduler.gamma", "data.val_size"};
  for (const JobSetting& s : JobSettings()) {
    const v1::Setting& o = *s.setting;
    if (!IsNumber(s.field) || s.field->is_repeated() || o.default_value().empty() ||
        std::stod(o.default_value()) == 0 || (o.has_min() && o.min() > 0) ||
        (o.has_max() && o.max() < 0) || s.field->real_containing_oneof() != nullptr ||
        known.count(s.path) > 0) {
      continue;
    }
    v1::JobSpec spec = Normalized();
    if (s.path.rfind("data.shards.", 0) == 0) {  // a oneof's choice: streamed shards
      spec.mutable_data()->mutable_shards()->set_train("worker:/data/train-{0..1}.tar");
      spec.mutable_data()->mutable_shards()->add_fields()->set_name("npy");
    }
    SetNumber(&spec, s.path, 0);
    const absl::Status normalized = NormalizeJobSpec(&spec);
    ASSERT_TRUE(normalized.ok()) << s.path << ": " << normalized;
    EXPECT_EQ(Get(&spec, s.path), "0") << s.path << ": make it `optional` in job_spec.proto";
    if (o.side() == v1::Setting::WORKERS) {
      v1::SetupRequest request = MakeSetupRequest(spec, Context());
      ASSERT_TRUE(NormalizeSetupRequest(&request).ok()) << s.path;
      EXPECT_EQ(Get(request.mutable_spec(), s.path), "0") << s.path << " on the worker";
    }
  }
}

TEST(JobSettingsTest, NormalizeSetupRequest_RefusesWhatTheSpecRefuses_NamingTheField) {
  int refused = 0;
  for (const JobSetting& s : JobSettings()) {
    if (s.setting->side() != v1::Setting::WORKERS || s.field->real_containing_oneof() != nullptr ||
        InList(s.path)) {
      continue;
    }
    std::vector<std::function<void(v1::JobSpec*)>> bad;
    if (s.setting->has_min()) {
      // Below the range, and not 0 (which a default would replace).
      const double below = s.setting->min() - 1 == 0 ? -1 : s.setting->min() - 1;
      bad.push_back([&, below](v1::JobSpec* spec) { SetNumber(spec, s.path, below); });
    }
    if (s.setting->has_max()) {
      bad.push_back([&](v1::JobSpec* spec) { SetNumber(spec, s.path, s.setting->max() * 2 + 1); });
    }
    if (s.setting->names_size() > 0 || !s.setting->plugin_kind().empty()) {
      bad.push_back([&](v1::JobSpec* spec) {
        auto [m, f] = Resolve(spec, s.path);
        m->GetReflection()->SetString(m, f, "Not A Name");
      });
    }
    for (const auto& change : bad) {
      v1::SetupRequest request = MakeSetupRequest(NormalizedFor(s.path), Context());
      change(request.mutable_spec());
      const absl::Status status = NormalizeSetupRequest(&request);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << s.path;
      EXPECT_THAT(std::string(status.message()), StartsWith("spec." + s.path + ": ")) << status;
      ++refused;
    }
  }
  EXPECT_GT(refused, 20);
  v1::SetupRequest request = MakeSetupRequest(Normalized(), Context());
  request.mutable_group()->set_world_size(-2);
  EXPECT_THAT(std::string(NormalizeSetupRequest(&request).message()),
              StartsWith("group.world_size: "));
  // A refused name is FAILED_PRECONDITION there as in a spec.
  request = MakeSetupRequest(Normalized(), Context());
  request.mutable_spec()->mutable_trainer()->set_strategy("tpu_spawn");
  const absl::Status tpu = NormalizeSetupRequest(&request);
  EXPECT_EQ(tpu.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tpu.message()), StartsWith("spec.trainer.strategy: 'tpu_spawn' needs"));
}

TEST(JobSettingsTest, RangeMessages_SayTheRangeAndWhatZeroMeans) {
  v1::JobSpec spec = Normalized();
  spec.mutable_trainer()->set_devices(300);
  EXPECT_EQ(NormalizeJobSpec(&spec).message(),
            "trainer.devices: must be in [1, 256] (0: auto), got 300");
  spec = Normalized();
  spec.mutable_trainer()->set_batches_per_call(5000);
  EXPECT_EQ(NormalizeJobSpec(&spec).message(),
            "trainer.batches_per_call: must be in [1, 4096] (0: training calls sized to ~0.25 s "
            "each (1-1024 batches), predict 16), got 5000");
  spec = Normalized();
  spec.mutable_data()->set_batch_size(1 << 21);
  EXPECT_EQ(NormalizeJobSpec(&spec).message(),
            "data.batch_size: must be in [1, 1048576], got 2097152");
  spec = Normalized();
  spec.mutable_trainer()->set_bucket_cap_mb(std::nan(""));
  EXPECT_THAT(std::string(NormalizeJobSpec(&spec).message()),
              StartsWith("trainer.bucket_cap_mb: must be in"));
}

// Lightning's trainer default max_steps: -1 is taken, as "no limit" (0); below it is refused.
TEST(JobSettingsTest, MaxStepsMinusOne_IsNoLimitAsLightningsDefault) {
  v1::JobSpec spec;
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  spec.mutable_trainer()->set_max_steps(-1);
  ASSERT_TRUE(NormalizeJobSpec(&spec).ok());
  EXPECT_EQ(spec.trainer().max_steps(), 0);
  EXPECT_EQ(spec.trainer().max_epochs(), kLightningDefaultEpochs);  // as without max_steps
  spec = Normalized();
  spec.mutable_trainer()->set_max_steps(-2);
  EXPECT_EQ(NormalizeJobSpec(&spec).message(), "trainer.max_steps: must be >= -1, got -2");
}

// Lightning's strategy: auto becomes what Lightning picks for that many processes.
TEST(JobSettingsTest, StrategyAuto_ResolvedByDevicesAndNodes) {
  const auto resolved = [](int nodes, int devices) {
    v1::JobSpec spec;
    spec.mutable_model()->set_builtin("mlp");
    spec.mutable_data()->mutable_synthetic()->set_train_size(64);
    spec.mutable_trainer()->set_strategy("auto");
    spec.mutable_trainer()->set_num_nodes(nodes);
    spec.mutable_trainer()->set_devices(devices);
    const absl::Status s = NormalizeJobSpec(&spec);
    return s.ok() ? spec.trainer().strategy() : std::string(s.message());
  };
  EXPECT_EQ(resolved(0, 0), "single_device");
  EXPECT_EQ(resolved(1, 1), "single_device");
  EXPECT_EQ(resolved(2, 1), "ddp");
  EXPECT_EQ(resolved(1, 2), "ddp_spawn");
  EXPECT_EQ(resolved(2, 2), "ddp_spawn");
}

TEST(PluginCatalogTest, StrategyTraits_AliasesAndRefusals) {
  EXPECT_TRUE(IsDistributedStrategy("ddp"));
  EXPECT_TRUE(IsDistributedStrategy("ddp_sharded"));
  EXPECT_TRUE(IsDistributedStrategy("a_plugin")) << "a plugin strategy runs as ddp does";
  EXPECT_FALSE(IsDistributedStrategy("dp"));
  EXPECT_FALSE(IsDistributedStrategy("single_device"));
  v1::JobSpec spec = Normalized();
  spec.mutable_trainer()->set_strategy("ddp_spawn");
  spec.mutable_trainer()->set_devices(3);
  EXPECT_EQ(RanksPerWorker(spec), 3);
  spec.mutable_trainer()->set_strategy("ddp_sharded");
  ASSERT_TRUE(NormalizeJobSpec(&spec).ok());
  EXPECT_EQ(spec.trainer().strategy(), "sharded");
  EXPECT_EQ(RanksPerWorker(spec), 1);
  spec.mutable_trainer()->set_precision("16");
  spec.mutable_trainer()->set_accelerator("cuda");
  ASSERT_TRUE(NormalizeJobSpec(&spec).ok());
  EXPECT_EQ(spec.trainer().precision(), "16-mixed");
  EXPECT_EQ(spec.trainer().accelerator(), "gpu");
  for (const char* refused : {"mps", "hpu", "ipu", "tpu"}) {
    spec.mutable_trainer()->set_accelerator(refused);
    EXPECT_EQ(NormalizeJobSpec(&spec).code(), absl::StatusCode::kFailedPrecondition) << refused;
  }
  EXPECT_EQ(SettingNames("trainer.strategy"),
            (std::vector<std::string>{"ddp", "ddp_spawn", "sharded", "dp", "single_device"}));
  EXPECT_EQ(PluginsNamedBy(Normalized()), (std::vector<std::pair<std::string, std::string>>{}));
}

}  // namespace job_settings_test
}  // namespace dtrain

// The one home of job settings (common/job_settings.h): every field of JobSpec is listed with
// where it goes, MakeSetupRequest carries exactly the listed fields to the SetupRequest and no
// other, and CheckSetupRequest accepts what a normalized spec produces and refuses what the spec
// rules refuse, naming the field. A field added to jobs.proto and not here fails this test.
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

#include "absl/strings/str_split.h"
#include "common/job_settings.h"
#include "common/job_spec.h"

namespace dtrain {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using ::testing::HasSubstr;
using ::testing::StartsWith;

void Leaves(const google::protobuf::Descriptor* d, const std::string& prefix,
            std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : prefix + "." + f->name();
    if (f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_map()) {
      Leaves(f->message_type(), path, out);
    } else {
      out->push_back(path);
    }
  }
}

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
  if (f->is_map()) {
    std::ostringstream out;
    for (int i = 0; i < r->FieldSize(*m, f); ++i) {
      const Message& entry = r->GetRepeatedMessage(*m, f, i);
      const google::protobuf::Reflection* er = entry.GetReflection();
      out << er->GetString(entry, entry.GetDescriptor()->FindFieldByName("key")) << "="
          << er->GetString(entry, entry.GetDescriptor()->FindFieldByName("value"));
    }
    return out.str();
  }
  if (f->is_repeated()) {
    std::ostringstream out;
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
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      std::ostringstream out;
      out << r->GetDouble(*m, f);
      return out.str();
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(*m, f) ? "true" : "false";
    default:
      return "";
  }
}

v1::JobSpec Normalized() {
  v1::JobSpec spec;
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  EXPECT_TRUE(NormalizeJobSpec(&spec).ok());
  return spec;
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

TEST(JobSettingsTest, EveryJobSpecFieldIsListedOnce_AndNothingElse) {
  std::vector<std::string> leaves;
  Leaves(v1::JobSpec::descriptor(), "", &leaves);
  std::map<std::string, int> listed;
  for (const JobSpecField& f : JobSpecFields()) ++listed[f.spec_path];
  for (const std::string& leaf : leaves) {
    EXPECT_EQ(listed[leaf], 1) << "JobSpec field '" << leaf
                               << "' must be listed once in JobSpecFields (common/job_settings.cc)";
  }
  const std::set<std::string> real(leaves.begin(), leaves.end());
  for (const JobSpecField& f : JobSpecFields()) {
    EXPECT_TRUE(real.count(f.spec_path))
        << "JobSpecFields lists '" << f.spec_path << "', which JobSpec does not have";
  }
}

TEST(JobSettingsTest, MakeSetupRequest_CarriesEachListedFieldToItsPath) {
  for (const JobSpecField& field : JobSpecFields()) {
    if (field.setup_path.empty()) continue;
    v1::JobSpec spec = Normalized();
    const std::string value = SetDistinct(&spec, field.spec_path);
    v1::SetupRequest request = MakeSetupRequest(spec, Context());
    std::string expected = value;
    if (field.spec_path == "trainer.bucket_cap_mb") expected = std::to_string(1 << 19);  // MiB
    EXPECT_EQ(Get(&request, field.setup_path), expected) << field.spec_path;
  }
}

TEST(JobSettingsTest, CoordinatorOnlyFields_NeverReachTheWorkers) {
  const v1::SetupRequest base = MakeSetupRequest(Normalized(), Context());
  for (const JobSpecField& field : JobSpecFields()) {
    if (!field.setup_path.empty()) continue;
    v1::JobSpec spec = Normalized();
    SetDistinct(&spec, field.spec_path);
    EXPECT_TRUE(
        google::protobuf::util::MessageDifferencer::Equals(MakeSetupRequest(spec, Context()), base))
        << field.spec_path << " is listed as the coordinator's only, but changes the Setup";
  }
}

TEST(JobSettingsTest, MakeSetupRequest_GroupFromTheContext) {
  const v1::SetupRequest r = MakeSetupRequest(Normalized(), Context());
  EXPECT_EQ(r.job_id(), "job-1");
  EXPECT_EQ(r.group().group(), "job-1.2");
  EXPECT_EQ(r.group().coordinator(), "127.0.0.1:1");
  EXPECT_EQ(r.group().token(), "t");
  EXPECT_EQ(r.group().world_size(), 4);
  EXPECT_EQ(r.group().register_timeout_ms(), 300000);
  EXPECT_EQ(r.data().synthetic().train_size(), 64);
  EXPECT_EQ(r.bucket_bytes(), 25 << 20);  // the spec's default, in bytes
}

TEST(JobSettingsTest, CheckSetupRequest_AcceptsWhatSpecsProduce_AtTheirLimits) {
  v1::JobSpec spec = Normalized();
  EXPECT_TRUE(CheckSetupRequest(MakeSetupRequest(spec, Context())).ok());
  spec.mutable_trainer()->set_devices(kDevicesRange.high);
  spec.mutable_trainer()->set_accumulate_grad_batches(kAccumulateGradBatchesRange.high);
  spec.mutable_trainer()->set_bucket_cap_mb(kBucketCapMbRange.high);
  spec.mutable_trainer()->set_gradient_clip_val(kGradientClipValRange.high);
  for (const std::string& backend : CollectiveBackendNames()) {
    spec.mutable_trainer()->set_collective_backend(backend);
    ASSERT_TRUE(NormalizeJobSpec(&spec).ok());
    const absl::Status s = CheckSetupRequest(MakeSetupRequest(spec, Context()));
    EXPECT_TRUE(s.ok()) << backend << ": " << s;
  }
  // A hand-written Setup may leave settings at 0: the worker's defaults.
  EXPECT_TRUE(CheckSetupRequest(v1::SetupRequest()).ok());
}

TEST(JobSettingsTest, CheckSetupRequest_RefusesWhatTheSpecRefuses_NamingTheField) {
  struct Case {
    std::function<void(v1::SetupRequest*)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::SetupRequest* r) { r->set_devices(kDevicesRange.high + 1); }, "devices"},
      {[](v1::SetupRequest* r) { r->set_devices(-1); }, "devices"},
      {[](v1::SetupRequest* r) { r->set_accumulate_grad_batches(-3); }, "accumulate_grad_batches"},
      {[](v1::SetupRequest* r) { r->set_gradient_clip_val(-1); }, "gradient_clip_val"},
      {[](v1::SetupRequest* r) { r->set_gradient_clip_val(std::nan("")); }, "gradient_clip_val"},
      {[](v1::SetupRequest* r) { r->set_gradient_clip_algorithm("l3"); },
       "gradient_clip_algorithm"},
      {[](v1::SetupRequest* r) { r->set_bucket_bytes(-1); }, "bucket_bytes"},
      {[](v1::SetupRequest* r) { r->mutable_group()->set_backend("nccl"); }, "group.backend"},
      {[](v1::SetupRequest* r) { r->mutable_group()->set_world_size(-2); }, "group.world_size"},
      {[](v1::SetupRequest* r) { r->mutable_data()->set_val_size(-1); }, "data.val_size"},
  };
  for (const Case& c : cases) {
    v1::SetupRequest request = MakeSetupRequest(Normalized(), Context());
    c.change(&request);
    const absl::Status s = CheckSetupRequest(request);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(s.message()), StartsWith(c.field + ": ")) << s;
  }
  // The spec refuses the same devices with its own path.
  v1::JobSpec spec = Normalized();
  spec.mutable_trainer()->set_devices(kDevicesRange.high + 1);
  EXPECT_THAT(NormalizeJobSpec(&spec).message(), HasSubstr("trainer.devices"));
}

TEST(JobSettingsTest, DefaultsAreTheFirstNames) {
  const v1::JobSpec spec = Normalized();
  EXPECT_EQ(spec.stage(), StageNames()[0]);
  EXPECT_EQ(spec.trainer().strategy(), StrategyNames()[0]);
  EXPECT_EQ(spec.trainer().precision(), PrecisionNames()[0]);
  EXPECT_EQ(spec.trainer().accelerator(), AcceleratorNames()[0]);
  EXPECT_EQ(spec.trainer().collective_backend(), CollectiveBackendNames()[0]);
  EXPECT_EQ(spec.trainer().gradient_clip_algorithm(), ClipAlgorithmNames()[0]);
  EXPECT_EQ(spec.optimizer().name(), OptimizerNames()[0]);
  EXPECT_EQ(spec.lr_scheduler().name(), SchedulerNames()[0]);
  EXPECT_EQ(spec.data().batch_size(), kDefaultBatchSize);
  EXPECT_EQ(spec.trainer().bucket_cap_mb(), kDefaultBucketCapMb);
  EXPECT_TRUE(IsDistributedStrategy(spec.trainer().strategy()));
  EXPECT_FALSE(IsDistributedStrategy("dp"));
}

}  // namespace
}  // namespace dtrain

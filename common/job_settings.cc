#include "common/job_settings.h"

#include <cmath>
#include <functional>

#include <google/protobuf/message.h>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status Bad(absl::string_view path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

const v1::Setting& SettingOf(const FieldDescriptor* field) {
  return field->options().GetExtension(v1::setting);
}

void CollectLeaves(const Descriptor* d, const std::string& prefix, std::vector<JobSetting>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = Join(prefix, f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
      CollectLeaves(f->message_type(), path, out);
    } else {
      out->push_back({path, f, &SettingOf(f)});
    }
  }
}

bool IsIntegral(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return true;
    default:
      return false;
  }
}

bool IsNumber(const FieldDescriptor* f) {
  return IsIntegral(f) || f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ||
         f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT;
}

double NumberOf(const Message& m, const FieldDescriptor* f) {
  const Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<double>(r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return r->GetFloat(m, f);
    default:
      return r->GetDouble(m, f);
  }
}

// A number as messages print it: a whole number for an integer field.
std::string NumberText(const FieldDescriptor* f, double value) {
  if (IsIntegral(f)) return absl::StrCat(static_cast<int64_t>(value));
  return absl::StrCat(value);
}

// "unset": not present for a field with presence, else the type's zero.
bool IsUnset(const Message& m, const FieldDescriptor* f) {
  const Reflection* r = m.GetReflection();
  if (f->has_presence()) return !r->HasField(m, f);
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) return r->GetString(m, f).empty();
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) return !r->GetBool(m, f);
  return NumberOf(m, f) == 0;
}

// Sets `f` from the option's text; false when the text is not a value of the field's type.
bool SetFromText(Message* m, const FieldDescriptor* f, const std::string& text) {
  const Reflection* r = m->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(m, f, text);
      return true;
    case FieldDescriptor::CPPTYPE_BOOL:
      if (text != "true" && text != "false") return false;
      r->SetBool(m, f, text == "true");
      return true;
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r->SetInt32(m, f, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r->SetInt64(m, f, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r->SetUInt32(m, f, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r->SetUInt64(m, f, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v;
      if (!absl::SimpleAtod(text, &v)) return false;
      r->SetDouble(m, f, v);
      return true;
    }
    default:
      return false;
  }
}

// "must be in [1, 256]", "must be >= 0", with what 0 means when 0 is outside the range.
std::string RangeText(const FieldDescriptor* f, const v1::Setting& s) {
  std::string text;
  if (s.has_min() && s.has_max()) {
    text = absl::StrCat("must be in [", NumberText(f, s.min()), ", ", NumberText(f, s.max()), "]");
  } else if (s.has_min()) {
    text = absl::StrCat("must be >= ", NumberText(f, s.min()));
  } else {
    text = absl::StrCat("must be <= ", NumberText(f, s.max()));
  }
  const bool zero_outside = (s.has_min() && s.min() > 0) || (s.has_max() && s.max() < 0);
  if (!s.zero_means().empty() && zero_outside) absl::StrAppend(&text, " (0: ", s.zero_means(), ")");
  return text;
}

absl::Status ApplyToField(Message* m, const FieldDescriptor* f, const std::string& path,
                          const OfferedPlugins* offered) {
  const v1::Setting& s = SettingOf(f);
  const Reflection* r = m->GetReflection();
  if (!s.default_value().empty() && IsUnset(*m, f) && !SetFromText(m, f, s.default_value())) {
    return absl::InternalError(absl::StrCat(path, ": its default '", s.default_value(),
                                            "' (job_spec.proto) is not a ", f->type_name()));
  }
  if (IsNumber(f) && (s.has_min() || s.has_max())) {
    const double value = NumberOf(*m, f);
    if (value == 0 && !s.zero_means().empty()) return absl::OkStatus();
    if (!std::isfinite(value) || (s.has_min() && value < s.min()) ||
        (s.has_max() && value > s.max())) {
      return Bad(path, absl::StrCat(RangeText(f, s), ", got ", NumberText(f, value)));
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() != FieldDescriptor::CPPTYPE_STRING) return absl::OkStatus();
  std::string value = r->GetString(*m, f);
  if (s.path() != v1::Setting::NOT_A_PATH && f->real_containing_oneof() != nullptr &&
      value.empty()) {
    return Bad(path, "empty path");
  }
  if (value.empty() && !s.zero_means().empty()) return absl::OkStatus();
  if (!s.plugin_kind().empty()) {
    if (absl::Status st = ResolvePluginName(path, s.plugin_kind(), &value, offered); !st.ok()) {
      return st;
    }
    r->SetString(m, f, value);
  } else if (auto refused = absl::c_find_if(
                 s.refused(), [&](const v1::Setting::Word& w) { return w.word() == value; });
             refused != s.refused().end()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": '", value, "' ", refused->value()));
  } else if (s.names_size() > 0 && !absl::c_linear_search(s.names(), value)) {
    return Bad(path, absl::StrCat("unknown ", s.noun().empty() ? "value" : s.noun(), " '", value,
                                  "'; use ", absl::StrJoin(s.names(), ", ")));
  }
  return absl::OkStatus();
}

// `sections`: make `m`'s message fields present (JobSpec's sections); deeper messages count
// only when set.
absl::Status Apply(Message* m, const std::string& prefix, bool sections,
                   const OfferedPlugins* offered) {
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = Join(prefix, f->name());
    const google::protobuf::OneofDescriptor* oneof = f->real_containing_oneof();
    if (oneof != nullptr && r->GetOneofFieldDescriptor(*m, oneof) != f) continue;
    if (f->is_repeated()) continue;  // lists and maps: only rules in code
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!sections && !r->HasField(*m, f)) continue;
      if (absl::Status s = Apply(r->MutableMessage(m, f), path, false, offered); !s.ok()) return s;
      continue;
    }
    if (absl::Status s = ApplyToField(m, f, path, offered); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Calls `visit` with every set path field under `m` and writes back what it leaves there.
absl::Status VisitPaths(Message* m, const std::string& prefix,
                        const std::function<absl::Status(SpecPath*)>& visit) {
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const google::protobuf::OneofDescriptor* oneof = f->real_containing_oneof();
    if (oneof != nullptr && r->GetOneofFieldDescriptor(*m, oneof) != f) continue;
    if (f->is_repeated()) continue;
    const std::string path = Join(prefix, f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!r->HasField(*m, f)) continue;
      if (absl::Status s = VisitPaths(r->MutableMessage(m, f), path, visit); !s.ok()) return s;
      continue;
    }
    const v1::Setting& s = SettingOf(f);
    if (s.path() == v1::Setting::NOT_A_PATH) continue;
    SpecPath found{path, s.path(), r->GetString(*m, f)};
    if (found.value.empty()) continue;
    const std::string before = found.value;
    if (absl::Status status = visit(&found); !status.ok()) return status;
    if (found.value != before) r->SetString(m, f, found.value);
  }
  return absl::OkStatus();
}

void ClearSide(Message* m, v1::Setting::Side side) {
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
      if (!f->is_repeated() && r->HasField(*m, f)) ClearSide(r->MutableMessage(m, f), side);
      continue;
    }
    if (SettingOf(f).side() == side) r->ClearField(m, f);
  }
}

}  // namespace

const std::vector<JobSetting>& JobSettings() {
  static const auto* settings = [] {
    auto* out = new std::vector<JobSetting>();
    CollectLeaves(v1::JobSpec::descriptor(), "", out);
    return out;
  }();
  return *settings;
}

const JobSetting* FindJobSetting(absl::string_view path) {
  for (const JobSetting& s : JobSettings()) {
    if (s.path == path) return &s;
  }
  return nullptr;
}

int64_t MostBatchRows() {
  static const int64_t most =
      static_cast<int64_t>(FindJobSetting("data.batch_size")->setting->max());
  return most;
}

std::vector<std::string> SettingNames(absl::string_view path) {
  const JobSetting* s = FindJobSetting(path);
  if (s == nullptr) return {};
  if (!s->setting->plugin_kind().empty()) return CatalogNames(s->setting->plugin_kind());
  return {s->setting->names().begin(), s->setting->names().end()};
}

const std::map<std::string, std::string>& ReplacedKeys() {
  static const auto* keys = [] {
    auto* out = new std::map<std::string, std::string>();
    for (const JobSetting& s : JobSettings()) {
      for (const v1::Setting::Replaced& r : s.setting->replaces()) (*out)[r.key()] = r.hint();
    }
    return out;
  }();
  return *keys;
}

absl::Status ApplySettings(v1::JobSpec* spec, const OfferedPlugins* offered) {
  return Apply(spec, "", /*sections=*/true, offered);
}

const v1::JobSpec& JobSpecDefaults() {
  static const v1::JobSpec* defaults = [] {
    auto* spec = new v1::JobSpec();
    // An empty spec passes every option (job_settings_test checks it): nothing to report.
    ApplySettings(spec).IgnoreError();
    return spec;
  }();
  return *defaults;
}

std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec) {
  std::vector<SpecPath> paths;
  v1::JobSpec copy = spec;
  RewriteSpecPaths(&copy, [&](SpecPath* p) {
    paths.push_back(*p);
    return absl::OkStatus();
  }).IgnoreError();
  return paths;
}

absl::Status RewriteSpecPaths(v1::JobSpec* spec,
                              const std::function<absl::Status(SpecPath* path)>& rewrite) {
  return VisitPaths(spec, "", rewrite);
}

void ClearCoordinatorSettings(v1::JobSpec* spec) { ClearSide(spec, v1::Setting::COORDINATOR); }

}  // namespace dtrain

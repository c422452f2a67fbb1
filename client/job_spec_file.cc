#include "client/job_spec_file.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_reference.h"
#include "common/job_settings.h"
#include "common/proto_yaml.h"
#include "dtrain/v1/setting.pb.h"

namespace dtrain {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

absl::Status Bad(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

template <typename T>
absl::StatusOr<T> Scalar(const YAML::Node& node, const std::string& path, const char* what) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    return Bad(path, absl::StrCat("expected ", what, ", got '", node.Scalar(), "'"));
  }
}

absl::Status Fill(const YAML::Node& node, Message* message, const std::string& path);

// A list of numbers or strings (`mean: [0.5, 0.4]`), or one value for a list of one.
absl::Status SetRepeated(const YAML::Node& value, Message* message, const FieldDescriptor* field,
                         const std::string& path) {
  const google::protobuf::Reflection* r = message->GetReflection();
  std::vector<YAML::Node> items;
  if (value.IsSequence()) {
    for (const YAML::Node& item : value) items.push_back(item);
  } else if (value.IsScalar()) {
    items.push_back(value);
  } else {
    return Bad(path, "expected a list");
  }
  r->ClearField(message, field);
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string where = absl::StrCat(path, "[", i, "]");
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      // A list of mappings (`fields: [{name: jpg, type: image}]`, transforms).
      if (!items[i].IsMap()) return Bad(where, "expected a mapping");
      if (absl::Status s = Fill(items[i], r->AddMessage(message, field), where); !s.ok()) return s;
      continue;
    }
    if (!items[i].IsScalar()) return Bad(where, "expected a single value");
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        auto v = Scalar<double>(items[i], where, "a number");
        if (!v.ok()) return v.status();
        r->AddDouble(message, field, *v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        auto v = Scalar<int64_t>(items[i], where, "an integer");
        if (!v.ok()) return v.status();
        r->AddInt64(message, field, *v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        auto v = Scalar<int32_t>(items[i], where, "an integer");
        if (!v.ok()) return v.status();
        r->AddInt32(message, field, *v);
        break;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        auto v = Scalar<float>(items[i], where, "a number");
        if (!v.ok()) return v.status();
        r->AddFloat(message, field, *v);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(message, field, items[i].Scalar());
        break;
      default:
        return Bad(path, "this list cannot be set from a file");
    }
  }
  return absl::OkStatus();
}

// A map<string, string> (`storage_options: {fsync: "true"}`): scalar values, as text.
absl::Status SetStringMap(const YAML::Node& value, Message* message, const FieldDescriptor* field,
                          const std::string& path) {
  if (value.IsNull()) return absl::OkStatus();
  if (!value.IsMap()) return Bad(path, "expected a mapping of names to values");
  const google::protobuf::Reflection* r = message->GetReflection();
  r->ClearField(message, field);
  for (const auto& entry : value) {
    const std::string key = entry.first.Scalar();
    if (!entry.second.IsScalar()) return Bad(Join(path, key), "expected a single value");
    Message* item = r->AddMessage(message, field);
    const google::protobuf::Descriptor* d = item->GetDescriptor();
    item->GetReflection()->SetString(item, d->FindFieldByName("key"), key);
    item->GetReflection()->SetString(item, d->FindFieldByName("value"), entry.second.Scalar());
  }
  return absl::OkStatus();
}

// Lightning's flags that take words or either kind of number (the Setting's words and
// fraction_field): the value as the field reads it, or the sibling field it sets instead.
YAML::Node LightningValue(const YAML::Node& value, Message* message,
                          const FieldDescriptor** field) {
  const v1::Setting& s = (*field)->options().GetExtension(v1::setting);
  std::string lower = absl::AsciiStrToLower(value.Scalar());
  bool truth = false;
  if (YAML::convert<bool>::decode(value, truth)) lower = truth ? "true" : "false";  // yes, on
  for (const v1::Setting::Word& w : s.words()) {
    if (lower == w.word()) return YAML::Node(w.value());
  }
  int64_t whole = 0;
  double number = 0;
  if (!s.fraction_field().empty() && !absl::SimpleAtoi(value.Scalar(), &whole) &&
      absl::SimpleAtod(value.Scalar(), &number)) {
    // Lightning's _determine_batch_limits: 10.0 is ten batches; 0.25 or 1.0 a share.
    if (number > 1 && std::floor(number) == number && number < 9e18) {
      return YAML::Node(absl::StrCat(static_cast<int64_t>(number)));
    }
    const FieldDescriptor* fraction = message->GetDescriptor()->FindFieldByName(s.fraction_field());
    if (fraction != nullptr) *field = fraction;
  }
  return value;
}

// A Lightning flag's count and fraction (Setting.fraction_field): one key, whichever spelling a
// later file or override uses.
bool SameLightningFlag(const FieldDescriptor* a, const FieldDescriptor* b) {
  return a->options().GetExtension(v1::setting).fraction_field() == b->name() ||
         b->options().GetExtension(v1::setting).fraction_field() == a->name();
}

absl::Status SetField(const YAML::Node& given, Message* message, const FieldDescriptor* field,
                      const std::string& path) {
  const google::protobuf::Reflection* r = message->GetReflection();
  if (field->is_map()) return SetStringMap(given, message, field, path);
  if (field->is_repeated()) return SetRepeated(given, message, field, path);
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return Fill(given, r->MutableMessage(message, field), path);
  }
  if (!given.IsScalar()) return Bad(path, "expected a single value");
  const YAML::Node value = LightningValue(given, message, &field);
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      auto v = Scalar<int32_t>(value, path, "an integer");
      if (!v.ok()) return v.status();
      r->SetInt32(message, field, *v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      auto v = Scalar<int64_t>(value, path, "an integer");
      if (!v.ok()) return v.status();
      r->SetInt64(message, field, *v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      auto v = Scalar<uint64_t>(value, path, "a non-negative integer");
      if (!v.ok()) return v.status();
      r->SetUInt64(message, field, *v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      auto v = Scalar<double>(value, path, "a number");
      if (!v.ok()) return v.status();
      r->SetDouble(message, field, *v);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      auto v = Scalar<bool>(value, path, "true or false");
      if (!v.ok()) return v.status();
      r->SetBool(message, field, *v);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      auto v = Scalar<float>(value, path, "a number");
      if (!v.ok()) return v.status();
      r->SetFloat(message, field, *v);
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      // torchvision's spelling ("bilinear", "edge") or the enum's own (INTERPOLATION_BILINEAR).
      const google::protobuf::EnumDescriptor* e = field->enum_type();
      const std::string text = value.Scalar();
      const google::protobuf::EnumValueDescriptor* v = e->FindValueByName(text);
      if (v == nullptr) {
        v = e->FindValueByName(absl::AsciiStrToUpper(absl::StrCat(field->name(), "_", text)));
      }
      if (v == nullptr) {
        std::vector<std::string> names;
        const std::string prefix = absl::AsciiStrToUpper(field->name()) + "_";
        for (int i = 0; i < e->value_count(); ++i) {
          std::string n = e->value(i)->name();
          if (absl::StartsWith(n, prefix)) n = absl::AsciiStrToLower(n.substr(prefix.size()));
          names.push_back(n);
        }
        return Bad(path,
                   absl::StrCat("unknown value '", text, "'; use ", absl::StrJoin(names, ", ")));
      }
      r->SetEnum(message, field, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      // YAML reads `precision: 32` as a number; the field wants its text, which is "32".
      r->SetString(message, field, value.Scalar());
      break;
    default:
      return Bad(path, "this field cannot be set from a file");
  }
  return absl::OkStatus();
}

absl::Status Fill(const YAML::Node& node, Message* message, const std::string& path) {
  const google::protobuf::Descriptor* d = message->GetDescriptor();
  if (node.IsNull()) return absl::OkStatus();  // `checkpoint:` with nothing under it
  if (!node.IsMap()) {
    return Bad(path.empty() ? "spec" : path, "expected a mapping of keys to values");
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.Scalar();
    const std::string where = Join(path, key);
    const FieldDescriptor* field = d->FindFieldByName(key);
    if (field == nullptr) field = d->FindFieldByCamelcaseName(key);
    if (field == nullptr) {
      // Keys dtrain once spelled differently from Lightning: the old one points at the new
      // (the Setting options' `replaces`).
      if (auto renamed = ReplacedKeys().find(where); renamed != ReplacedKeys().end()) {
        return Bad(where, renamed->second);
      }
      std::vector<std::string> known;
      for (int i = 0; i < d->field_count(); ++i) known.push_back(d->field(i)->name());
      return Bad(where, absl::StrCat("unknown key; ", path.empty() ? "a job spec" : path, " has ",
                                     absl::StrJoin(known, ", ")));
    }
    if (const google::protobuf::OneofDescriptor* oneof = field->real_containing_oneof()) {
      const FieldDescriptor* set =
          message->GetReflection()->GetOneofFieldDescriptor(*message, oneof);
      if (set != nullptr && set != field && !SameLightningFlag(set, field)) {
        return Bad(path, absl::StrCat("give only one of ", set->name(), " and ", field->name()));
      }
    }
    if (entry.second.IsNull() && field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      return Bad(where, "has no value");
    }
    if (absl::Status s = SetField(entry.second, message, field, where); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> LoadYaml(const std::string& text) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat("syntax error at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text) {
  absl::StatusOr<YAML::Node> root = LoadYaml(text);
  if (!root.ok()) return root.status();
  v1::JobSpec spec;
  if (absl::Status s = Fill(*root, &spec, ""); !s.ok()) return s;
  return spec;
}

namespace {

// Makes absolute, against `base`, the relative paths (the fields whose Setting says they are
// paths) that differ from `before`'s.
void ResolveChangedPaths(const v1::JobSpec& before, const std::string& base, v1::JobSpec* spec) {
  std::map<std::string, std::string> old;
  for (const SpecPath& p : SpecPaths(before)) old[p.path] = p.value;
  RewriteSpecPaths(spec, [&](SpecPath* p) {
    if (std::filesystem::path(p->value).is_absolute() || IsMarkedPath(p->value) ||
        IsHttpUrl(p->value)) {
      return absl::OkStatus();
    }
    auto it = old.find(p->path);
    if (it != old.end() && it->second == p->value) return absl::OkStatus();
    p->value = (std::filesystem::path(base) / p->value).lexically_normal().string();
    return absl::OkStatus();
  }).IgnoreError();
}

void EmitValue(const Message& message, const FieldDescriptor* field, int index, YAML::Emitter& out);

void Emit(const Message& message, YAML::Emitter& out, bool top) {
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const google::protobuf::Reflection* r = message.GetReflection();
  out << YAML::BeginMap;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    // The stage is the subcommand, never a key of a config.
    if (top && field->name() == "stage") continue;
    if ((field->real_containing_oneof() != nullptr || field->has_presence()) &&
        !field->is_repeated() && !r->HasField(message, field)) {
      continue;
    }
    out << YAML::Key << field->name() << YAML::Value;
    if (field->is_map()) {  // map<string, string>
      out << YAML::Flow << YAML::BeginMap;
      for (int k = 0; k < r->FieldSize(message, field); ++k) {
        const Message& entry = r->GetRepeatedMessage(message, field, k);
        const google::protobuf::Descriptor* e = entry.GetDescriptor();
        out << YAML::Key << entry.GetReflection()->GetString(entry, e->FindFieldByName("key"))
            << YAML::Value << YAML::DoubleQuoted
            << entry.GetReflection()->GetString(entry, e->FindFieldByName("value"));
      }
      out << YAML::EndMap;
      continue;
    }
    if (field->is_repeated()) {
      out << YAML::Flow << YAML::BeginSeq;
      for (int k = 0; k < r->FieldSize(message, field); ++k) EmitValue(message, field, k, out);
      out << YAML::EndSeq;
      continue;
    }
    EmitValue(message, field, -1, out);
  }
  out << YAML::EndMap;
}

// One value of `field`: element `index` of a repeated field, or the field's own.
void EmitValue(const Message& message, const FieldDescriptor* field, int index,
               YAML::Emitter& out) {
  if (EmitScalarField(out, message, field, index)) return;
  const google::protobuf::Reflection* r = message.GetReflection();
  Emit(field->is_repeated() ? r->GetRepeatedMessage(message, field, index)
                            : r->GetMessage(message, field),
       out, false);
}

}  // namespace

absl::Status ApplyOverride(const std::string& dotted, const std::string& value, v1::JobSpec* spec) {
  const std::vector<std::string> keys = absl::StrSplit(dotted, '.');
  for (const std::string& key : keys) {
    if (key.empty()) return Bad(dotted, "an override is --section.key=value");
  }
  // The value is YAML, so --data.normalize.mean=[0.5,0.4] is a list and 5 is a number; text
  // that is not YAML (a stray ':' or '[') is taken as it is.
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception&) {
    parsed = YAML::Node(value);
  }
  if (parsed.IsNull() && !value.empty()) parsed = YAML::Node(value);
  if (value.empty()) return Bad(dotted, "has no value");
  // Nested maps from the leaf up. (A yaml-cpp Node is a reference: `=` would write into the
  // node it refers to, so each level is a node of its own.)
  YAML::Node root = parsed;
  for (size_t i = keys.size(); i-- > 0;) {
    YAML::Node level(YAML::NodeType::Map);
    level[keys[i]] = root;
    root.reset(level);
  }
  const v1::JobSpec before = *spec;
  if (absl::Status s = Fill(root, spec, ""); !s.ok()) return s;
  ResolveChangedPaths(before, std::filesystem::current_path().string(), spec);
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> ReadJobConfig(
    const std::vector<std::string>& files,
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  v1::JobSpec spec;
  for (const std::string& path : files) {
    std::ifstream in(path);
    if (!in.good()) {
      return absl::NotFoundError(absl::StrCat("config file '", path, "' does not exist"));
    }
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<YAML::Node> root = LoadYaml(text.str());
    const v1::JobSpec before = spec;
    absl::Status filled = root.ok() ? Fill(*root, &spec, "") : root.status();
    if (!filled.ok()) {
      return absl::Status(filled.code(), absl::StrCat(path, ": ", filled.message()));
    }
    ResolveChangedPaths(before, std::filesystem::absolute(path).parent_path().string(), &spec);
  }
  for (const auto& [key, value] : overrides) {
    if (absl::Status s = ApplyOverride(key, value, &spec); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--", key, ": ", s.message()));
    }
  }
  if (!spec.stage().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage: '", spec.stage(), "' is chosen by the subcommand, as LightningCLI's: ", "dtrain ",
        spec.stage(), " --config FILE; remove the key"));
  }
  return spec;
}

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  Emit(spec, out, true);
  return std::string(out.c_str()) + "\n";
}

}  // namespace dtrain

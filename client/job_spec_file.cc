#include "client/job_spec_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(message, field, items[i].Scalar());
        break;
      default:
        return Bad(path, "this list cannot be set from a file");
    }
  }
  return absl::OkStatus();
}

absl::Status SetField(const YAML::Node& value, Message* message, const FieldDescriptor* field,
                      const std::string& path) {
  const google::protobuf::Reflection* r = message->GetReflection();
  if (field->is_repeated()) return SetRepeated(value, message, field, path);
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return Fill(value, r->MutableMessage(message, field), path);
  }
  if (!value.IsScalar()) return Bad(path, "expected a single value");
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
      std::vector<std::string> known;
      for (int i = 0; i < d->field_count(); ++i) known.push_back(d->field(i)->name());
      return Bad(where, absl::StrCat("unknown key; ", path.empty() ? "a job spec" : path, " has ",
                                     absl::StrJoin(known, ", ")));
    }
    if (const google::protobuf::OneofDescriptor* oneof = field->real_containing_oneof()) {
      const FieldDescriptor* set =
          message->GetReflection()->GetOneofFieldDescriptor(*message, oneof);
      if (set != nullptr && set != field) {
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

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat("syntax error at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  v1::JobSpec spec;
  if (absl::Status s = Fill(root, &spec, ""); !s.ok()) return s;
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return absl::NotFoundError(absl::StrCat("job file '", path, "' does not exist"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(text.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  ResolvePaths(std::filesystem::absolute(path).parent_path().string(), &*spec);
  return spec;
}

void ResolvePaths(const std::string& base, v1::JobSpec* spec) {
  auto resolve = [&](std::string* p) {
    if (p->empty() || std::filesystem::path(*p).is_absolute()) return;
    *p = (std::filesystem::path(base) / *p).lexically_normal().string();
  };
  if (spec->model().has_torchscript()) resolve(spec->mutable_model()->mutable_torchscript());
  if (spec->data().has_tensors_file()) resolve(spec->mutable_data()->mutable_tensors_file());
  if (!spec->data().data_dir().empty()) resolve(spec->mutable_data()->mutable_data_dir());
  if (!spec->resume_from().empty()) resolve(spec->mutable_resume_from());
  if (!spec->checkpoint().dirpath().empty()) {
    resolve(spec->mutable_checkpoint()->mutable_dirpath());
  }
}

}  // namespace dtrain

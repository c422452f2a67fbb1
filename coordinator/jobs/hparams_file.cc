#include "coordinator/jobs/hparams_file.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"

namespace dtrain {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void EmitScalar(YAML::Emitter& out, const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool repeated = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      out << (repeated ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out << (repeated ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      out << (repeated ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      out << (repeated ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out << (repeated ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      out << (repeated ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out << (repeated ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out << (repeated ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      // Quoted, so that "32" stays a string and "" is visible.
      out << YAML::DoubleQuoted
          << (repeated ? r->GetRepeatedString(m, f, index) : r->GetString(m, f));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

void EmitMessage(YAML::Emitter& out, const Message& m) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  out << YAML::BeginMap;
  for (const FieldDescriptor* f : fields) {
    out << YAML::Key << f->name() << YAML::Value;
    if (f->is_repeated()) {
      out << YAML::Flow << YAML::BeginSeq;
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          EmitMessage(out, r->GetRepeatedMessage(m, f, i));
        } else {
          EmitScalar(out, m, f, i);
        }
      }
      out << YAML::EndSeq;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      EmitMessage(out, r->GetMessage(m, f));
    } else {
      EmitScalar(out, m, f, 0);
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string ToYaml(const Message& message) {
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  EmitMessage(out, message);
  return std::string(out.c_str()) + "\n";
}

namespace {

bool IsIdentifier(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// The values come from a worker: each is checked to be one YAML flow value before it joins
// the file, so the file always parses.
std::string HyperParametersYaml(const ModelHyperParameters& model) {
  std::string out;
  for (const auto& [name, text] : model) {
    if (!IsIdentifier(name) || text.find('\n') != std::string::npos) continue;
    try {
      YAML::Node node = YAML::Load(text);
      if (!node.IsScalar() && !node.IsSequence()) continue;
    } catch (const YAML::Exception&) {
      continue;
    }
    absl::StrAppend(&out, "  ", name, ": ", text, "\n");
  }
  return out.empty() ? out : absl::StrCat("hyper_parameters:\n", out);
}

}  // namespace

absl::Status WriteHparamsFile(const std::string& path, const Message& spec,
                              const ModelHyperParameters& model) {
  return WriteFileAtomically(path, ToYaml(spec) + HyperParametersYaml(model));
}

}  // namespace dtrain

#include "coordinator/jobs/hparams_file.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <regex>
#include <unordered_set>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/atomic_file.h"
#include "common/proto_yaml.h"

namespace dtrain {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void EmitMessage(YAML::Emitter& out, const Message& m);

// Element `index` of `f` (repeated), or its own value: a scalar as EmitScalarField writes it,
// a message as its set fields.
void EmitValue(YAML::Emitter& out, const Message& m, const FieldDescriptor* f, int index) {
  if (EmitScalarField(out, m, f, index)) return;
  const Reflection* r = m.GetReflection();
  EmitMessage(out, f->is_repeated() ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
}

// The set fields of `m` as the keys and values of the mapping being emitted.
void EmitFields(YAML::Emitter& out, const Message& m) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    out << YAML::Key << f->name() << YAML::Value;
    if (!f->is_repeated()) {
      EmitValue(out, m, f, 0);
      continue;
    }
    out << YAML::Flow << YAML::BeginSeq;
    for (int i = 0; i < r->FieldSize(m, f); ++i) EmitValue(out, m, f, i);
    out << YAML::EndSeq;
  }
}

void EmitMessage(YAML::Emitter& out, const Message& m) {
  out << YAML::BeginMap;
  EmitFields(out, m);
  out << YAML::EndMap;
}

}  // namespace

std::string ToYaml(const Message& message) {
  YAML::Emitter out;
  // Escaped beyond ASCII, so that PyYAML reads every string back (a raw DEL fails the whole
  // file; a raw U+2028 is a line break to it).
  out.SetOutputCharset(YAML::EscapeNonAscii);
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

// A plain scalar as a worker writes one (common/yaml_float.h, yaml-cpp's bools and ints), which
// YAML 1.1 (PyYAML) and yaml-cpp read alike. Ints without leading zeros: PyYAML reads 012 as
// octal.
bool IsPlainNumberOrBool(const std::string& text) {
  // A double's shortest text is at most 24 characters, an int64's 20. The bound comes before
  // the regex, whose matcher recurses per character; and PyYAML (Python 3.11) refuses an int of
  // more than 4,300 digits, failing the whole file.
  if (text.size() > 32) return false;
  static const std::regex kPlain(
      R"(true|false|\.nan|-?\.inf|-?(0|[1-9][0-9]*)(\.[0-9]*([eE][-+][0-9]+)?)?)");
  return std::regex_match(text, kPlain);
}

// What save_hyperparameters() records, as the worker's emitter writes it: a quoted string, a
// number or bool, or a list of them; no tag (PyYAML's safe_load fails the whole file on a tag it
// does not know, and its unsafe load constructs what !!python/object names), no mapping.
// Lists nested deeper than the worker writes them (worker/model/lightning_module.cc) are refused
// before the checks recurse into them.
constexpr int kMaxDepth = 32;

// `budget` counts the nodes visited: an alias repeats the node it names without repeating its
// text, so that a few hundred bytes of anchors and aliases ([&a [0, 0], &b [*a, *a], ...]) would
// otherwise expand to millions of values in the file. What a worker writes has no aliases, and
// never more nodes than bytes.
bool IsRecordedValue(const YAML::Node& node, int depth, size_t& budget) {
  if (budget == 0) return false;
  --budget;
  if (node.IsScalar()) {
    return node.Tag() == "!" || (node.Tag() == "?" && IsPlainNumberOrBool(node.Scalar()));
  }
  if (!node.IsSequence() || node.Tag() != "?" || depth >= kMaxDepth) return false;
  for (const YAML::Node& item : node) {
    if (!IsRecordedValue(item, depth + 1, budget)) return false;
  }
  return true;
}

// Writes a value IsRecordedValue accepted again, in flow style: the file holds what dtrain
// writes, never a worker's text as it came (its anchors, comments, or block forms that would
// change the lines around it).
void EmitRecordedValue(YAML::Emitter& out, const YAML::Node& node) {
  if (node.IsScalar()) {
    if (node.Tag() == "!") {
      out << YAML::DoubleQuoted << node.Scalar();
    } else {
      out << node.Scalar();
    }
    return;
  }
  out << YAML::Flow << YAML::BeginSeq;
  for (const YAML::Node& item : node) EmitRecordedValue(out, item);
  out << YAML::EndSeq;
}

// A name YAML 1.1 reads as a bool or null (on, no, null...): quoted as a key, so that PyYAML
// keeps it a string.
bool IsBoolOrNullWord(const std::string& name) {
  static const std::regex kWord(
      "yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF|null|Null|NULL");
  return std::regex_match(name, kWord);
}

// How many left-out values the job's log names; the rest are counted.
constexpr size_t kMaxLeftOutLines = 20;

// Text from a worker as a log may show it: C-escaped, its first 64 bytes.
std::string EscapedPrefix(const std::string& text) {
  return absl::StrCat(absl::CHexEscape(text.substr(0, 64)), text.size() > 64 ? "..." : "");
}

// The values come from workers: each is parsed and checked here, and written again by
// EmitRecordedValue, so that the file always parses, in PyYAML too. A worker's own emitter only
// writes what passes, so what fails here came from elsewhere (another build, a hand-made
// module file); `left_out` gets a line for each.
std::vector<std::pair<std::string, YAML::Node>> RecordedValues(const ModelHyperParameters& model,
                                                               std::vector<std::string>& left_out) {
  std::vector<std::pair<std::string, YAML::Node>> values;
  std::unordered_set<std::string> names;
  // Worker text goes into the log as C-escaped and cut short: it may hold anything. A module
  // with thousands of bad values gets a count after the first kMaxLeftOutLines.
  size_t unnamed = 0;
  auto leave_out = [&](const std::string& name, absl::string_view why) {
    if (left_out.size() >= kMaxLeftOutLines) {
      ++unnamed;
      return;
    }
    left_out.push_back(absl::StrCat("hparams.yaml leaves out hyperparameter \"",
                                    EscapedPrefix(name), "\": ", why));
  };
  for (const auto& [name, text] : model) {
    if (!IsIdentifier(name)) {
      leave_out(name, "its name is not a Python identifier");
      continue;
    }
    // The first of a name, as a mapping has one.
    if (names.count(name) > 0) {
      leave_out(name, "the workers reported the name twice; the first value is kept");
      continue;
    }
    try {
      YAML::Node node = YAML::Load(text);
      size_t budget = text.size();
      if (IsRecordedValue(node, 0, budget)) {
        values.emplace_back(name, std::move(node));
        names.insert(name);
      } else {
        leave_out(name,
                  "its value is not one save_hyperparameters() records as a worker writes it: a "
                  "quoted string, a plain number or bool (at most 32 characters, no leading "
                  "zeros), or an untagged list of them nested at most 32 deep");
      }
    } catch (const YAML::Exception& e) {
      leave_out(name, absl::StrCat("its value is not YAML (", EscapedPrefix(e.msg), ")"));
    }
  }
  if (unnamed > 0) {
    left_out.push_back(
        absl::StrCat("hparams.yaml leaves out ", unnamed, " more hyperparameters, not named here"));
  }
  return values;
}

}  // namespace

std::string HparamsYaml(const Message& spec, const ModelHyperParameters& model,
                        std::vector<std::string>* left_out) {
  YAML::Emitter out;
  out.SetOutputCharset(YAML::EscapeNonAscii);
  out << YAML::BeginMap;
  EmitFields(out, spec);
  std::vector<std::string> unused;
  const std::vector<std::pair<std::string, YAML::Node>> values =
      RecordedValues(model, left_out != nullptr ? *left_out : unused);
  if (!values.empty()) {
    out << YAML::Key << "hyper_parameters" << YAML::Value << YAML::BeginMap;
    for (const auto& [name, node] : values) {
      out << YAML::Key;
      if (IsBoolOrNullWord(name)) out << YAML::DoubleQuoted;
      out << name << YAML::Value;
      EmitRecordedValue(out, node);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::Status WriteHparamsFile(const std::string& path, const Message& spec,
                              const ModelHyperParameters& model,
                              std::vector<std::string>* left_out) {
  return WriteFileAtomically(path, HparamsYaml(spec, model, left_out));
}

}  // namespace dtrain

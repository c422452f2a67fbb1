// libFuzzer target: hparams.yaml's text (coordinator/jobs/hparams_file.h) from a spec and the
// model's hyperparameters as workers send them (a name and a YAML flow text each, untrusted).
// The input's records are separated by NUL bytes: the spec's name, then names and values in
// turn. A crash, a sanitizer report, or text that is not printable ASCII lines, that yaml-cpp
// cannot parse, whose spec name does not read back, or that holds more values than were sent, a
// tag or a mapping among them, is a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_split.h"
#include "coordinator/jobs/hparams_file.h"
#include "dtrain/v1/job_spec.pb.h"

namespace {

// What dtrain writes as a hyperparameter: a string, number or bool, or a list of them, untagged.
bool IsWrittenValue(const YAML::Node& node) {
  if (node.IsScalar()) return node.Tag() == "!" || node.Tag() == "?";
  if (!node.IsSequence() || node.Tag() != "?") return false;
  for (const YAML::Node& item : node) {
    if (!IsWrittenValue(item)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), '\0');
  dtrain::v1::JobSpec spec;
  spec.set_name("fuzz " + parts[0]);
  dtrain::ModelHyperParameters model;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) model.emplace_back(parts[i], parts[i + 1]);
  const std::string text = dtrain::HparamsYaml(spec, model);
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c != '\n' && (byte < 0x20 || byte >= 0x7f)) std::abort();
  }
  YAML::Node yaml;
  try {
    yaml = YAML::Load(text);
  } catch (const YAML::Exception&) {
    std::abort();
  }
  if (!yaml.IsMap() || !yaml["name"] || !yaml["name"].IsScalar()) std::abort();
  const YAML::Node values = yaml["hyper_parameters"];
  if (!values) return 0;
  if (!values.IsMap() || values.size() == 0 || values.size() > model.size()) std::abort();
  for (const auto& entry : values) {
    if (!IsWrittenValue(entry.second)) std::abort();
  }
  return 0;
}

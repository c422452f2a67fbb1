// One protobuf field value as YAML, for the two places that print a JobSpec by reflection: the
// CLI's --print_config (client/job_spec_file.cc) and the coordinator's hparams.yaml
// (coordinator/jobs/hparams_file.cc). Which fields each prints differs; how a value is written
// must not, so that a spec one prints reads back through the other's reader.
#pragma once

#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

namespace dtrain {

// Emits element `index` of `field` of `message` when the field is repeated, else the field's
// own value (index ignored). Every scalar C++ type has its case, as reflection's getter of
// another type aborts the process: numbers as YAML reads them back (floats through YamlFloat),
// bools as true/false, enums by name, strings double-quoted so that "32" stays text and "" is a
// value. A message (or a list of them) is the caller's to write: returns false and emits
// nothing for one.
bool EmitScalarField(YAML::Emitter& out, const google::protobuf::Message& message,
                     const google::protobuf::FieldDescriptor* field, int index);

}  // namespace dtrain

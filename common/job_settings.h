// The reader of every job setting's one home: the Setting option on each field of JobSpec
// (proto/dtrain/v1/job_spec.proto; the option is setting.proto). It walks the descriptors and
// applies what the options state (defaults, ranges, names), and answers which fields are paths,
// which side reads each and which old keys each replaced. NormalizeJobSpec (job_spec.h) runs
// ApplySettings and adds the rules that relate several fields; the CLI's spec reader, the
// uploads, the coordinator, the worker and the tests ask here instead of listing fields.
// python/dtrain/spec.py reads the same options, and tests/python/test_settings.py checks that
// both read them alike.
//
// Thread-safety: everything here is safe from any thread (the tables are immutable).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/plugin_catalog.h"
#include "dtrain/v1/job_spec.pb.h"
#include "dtrain/v1/setting.pb.h"

namespace dtrain {

// A leaf field under JobSpec and its option.
struct JobSetting {
  std::string path;  // "trainer.bucket_cap_mb"
  const google::protobuf::FieldDescriptor* field;
  const v1::Setting* setting;  // the field's option; an empty Setting when it has none
};

// Every leaf field under JobSpec, depth first in declaration order. A field holding a message
// (a section, data.synthetic, data.normalize) is not a leaf: its fields are. A map is a leaf.
const std::vector<JobSetting>& JobSettings();
// The setting at `path`, or null.
const JobSetting* FindJobSetting(absl::string_view path);
// The most rows a batch may hold: data.batch_size's bound, which eval_batch_size shares. A
// worker checks every batch a call names against it before it makes a row of any index.
int64_t MostBatchRows();
// The names a text setting accepts: its option's names, or its plugin kind's catalog names
// (common/plugin_catalog.h). Empty for a setting that names nothing.
std::vector<std::string> SettingNames(absl::string_view path);
// The old dotted keys every setting replaced, each with the hint a spec using it gets.
const std::map<std::string, std::string>& ReplacedKeys();

// Applies the options to `spec`: an unset field with a default gets it; a number must lie in
// its range, unless it is 0 and the option says what 0 means; a text with names must be one of
// them ("" too, unless 0 has a meaning); a plugin name must be dtrain's own (an alias becomes
// its name) or a plugin `offered` lists (null: any well-formed name, see ResolvePluginName); a
// chosen path in a oneof must not be empty. JobSpec's sections are made present; a deeper
// message (data.synthetic, data.normalize) and a oneof's member only count when set.
// INVALID_ARGUMENT naming the field's path ("trainer.devices: must be in [1, 256], got 300"),
// or FAILED_PRECONDITION for a plugin name this build refuses.
absl::Status ApplySettings(v1::JobSpec* spec, const OfferedPlugins* offered = nullptr);

// A JobSpec with every default the options give: what the worker's own types start from
// (e.g. StrategyOptions::bucket_bytes), so that no default is written twice.
const v1::JobSpec& JobSpecDefaults();

// A path field of a spec that holds a path.
struct SpecPath {
  std::string path;  // "model.torchscript"
  v1::Setting::PathKind kind;
  std::string value;
};
// The path fields of `spec` holding a non-empty value (a oneof member only when chosen), in
// declaration order: what the client resolves and uploads, the coordinator checks and keeps,
// the worker makes local.
std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec);
// Calls `rewrite` with each of them and stores the value it leaves in `path->value`. The first
// error stops the walk and is returned.
absl::Status RewriteSpecPaths(v1::JobSpec* spec,
                              const std::function<absl::Status(SpecPath* path)>& rewrite);

// Clears every field only the coordinator reads (Setting.side COORDINATOR): the spec a worker
// receives holds its settings and nothing else.
void ClearCoordinatorSettings(v1::JobSpec* spec);

}  // namespace dtrain

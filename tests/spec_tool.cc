// dtrain_spec_tool: the C++ side of a job spec, as JSON, for tests/python/test_settings.py,
// which checks that python/dtrain/spec.py reads specs and the Setting options as C++ does.
// Built with the tests, never installed.
//   dtrain_spec_tool --table
//       the settings table read from the options (common/job_settings.h), one object per leaf
//   dtrain_spec_tool [--config=FILE]... [--set=KEY=VALUE]...
//       {"parsed": JobSpec | null, "error": "...", "normalized": JobSpec | null,
//        "normalize_error": "...", "normalize_code": "INVALID_ARGUMENT"}: what ReadJobConfig
//       (the CLI's reader) makes of the files and overrides, then NormalizeJobSpec of that
// Exit status 0 unless the arguments are malformed (2).
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "client/job_spec_file.h"
#include "common/job_settings.h"
#include "common/job_spec.h"

namespace dtrain {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "null";
  return out;
}

std::string Text(const std::string& text) {
  Value v;
  v.set_string_value(text);
  return Json(v);
}

Value Number(bool has, double value) {
  Value v;
  if (has) {
    v.set_number_value(value);
  } else {
    v.set_null_value(google::protobuf::NULL_VALUE);
  }
  return v;
}

Value String(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}

int PrintTable() {
  ListValue table;
  for (const JobSetting& s : JobSettings()) {
    const v1::Setting& o = *s.setting;
    Struct* row = table.add_values()->mutable_struct_value();
    auto& f = *row->mutable_fields();
    f["path"] = String(s.path);
    f["type"] = String(s.field->cpp_type_name());
    f["repeated"].set_bool_value(s.field->is_repeated());
    f["in_oneof"].set_bool_value(s.field->real_containing_oneof() != nullptr);
    f["side"] = String(v1::Setting::Side_Name(o.side()));
    f["default"] = String(o.default_value());
    f["min"] = Number(o.has_min(), o.min());
    f["max"] = Number(o.has_max(), o.max());
    f["zero_means"] = String(o.zero_means());
    ListValue* names = f["names"].mutable_list_value();
    for (const std::string& n : o.names()) *names->add_values() = String(n);
    f["plugin_kind"] = String(o.plugin_kind());
    f["path_kind"] = String(v1::Setting::PathKind_Name(o.path()));
    Struct* replaces = f["replaces"].mutable_struct_value();
    for (const v1::Setting::Replaced& r : o.replaces()) {
      (*replaces->mutable_fields())[r.key()] = String(r.hint());
    }
    f["unit"] = String(o.unit());
  }
  std::printf("%s\n", Json(table).c_str());
  return 0;
}

int ReadSpec(const std::vector<std::string>& files,
             const std::vector<std::pair<std::string, std::string>>& overrides) {
  absl::StatusOr<v1::JobSpec> parsed = ReadJobConfig(files, overrides);
  std::string out = "{";
  if (!parsed.ok()) {
    out += "\"parsed\": null, \"error\": " + Text(std::string(parsed.status().message())) +
           ", \"normalized\": null}";
    std::printf("%s\n", out.c_str());
    return 0;
  }
  out += "\"parsed\": " + Json(*parsed) + ", \"error\": null, ";
  v1::JobSpec normalized = *parsed;
  const absl::Status status = NormalizeJobSpec(&normalized);
  if (status.ok()) {
    out += "\"normalized\": " + Json(normalized) + "}";
  } else {
    out += "\"normalized\": null, \"normalize_error\": " + Text(std::string(status.message())) +
           ", \"normalize_code\": " + Text(absl::StatusCodeToString(status.code())) + "}";
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--table") return dtrain::PrintTable();
    if (absl::StartsWith(arg, "--config=")) {
      files.push_back(arg.substr(9));
    } else if (absl::StartsWith(arg, "--set=") && arg.find('=', 6) != std::string::npos) {
      const size_t eq = arg.find('=', 6);
      overrides.emplace_back(arg.substr(6, eq - 6), arg.substr(eq + 1));
    } else {
      std::fprintf(stderr, "usage: dtrain_spec_tool --table | [--config=FILE]... [--set=K=V]...\n");
      return 2;
    }
  }
  return dtrain::ReadSpec(files, overrides);
}

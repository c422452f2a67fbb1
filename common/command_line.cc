#include "common/command_line.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace dtrain {
namespace {

bool IsOurs(const absl::CommandLineFlag& flag) {
  // absl registers --flagfile, --fromenv, --helpfull and the like from its own sources.
  return !absl::StrContains(flag.Filename(), "absl/");
}

CommandLine UsageError(std::string message) {
  CommandLine out;
  out.outcome = CommandLine::Outcome::kUsageError;
  out.error = std::move(message);
  return out;
}

}  // namespace

CommandLine ParseFlags(int argc, char** argv, bool dotted, const std::set<std::string>& repeated) {
  CommandLine out;
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> to_set;
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (only_positional || arg == "-" || arg.rfind("-", 0) != 0) {
      out.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help" || arg == "--helpfull") {
      out.outcome = CommandLine::Outcome::kHelp;
      return out;
    }
    const std::string body = arg.substr(arg.rfind("--", 0) == 0 ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    const bool has_value = eq != std::string::npos;
    std::string value = has_value ? body.substr(eq + 1) : "";
    if (dotted && absl::StrContains(name, '.')) {
      if (!has_value) {
        if (i + 1 >= argc) return UsageError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      out.options.emplace_back(name, value);
      continue;
    }
    name = absl::StrReplaceAll(name, {{"-", "_"}});
    if (repeated.count(name) > 0) {
      if (!has_value) {
        if (i + 1 >= argc) return UsageError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      out.options.emplace_back(name, value);
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && !IsOurs(*flag)) flag = nullptr;
    if (flag == nullptr && !has_value && name.rfind("no", 0) == 0) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && IsOurs(*negated) && negated->IsOfType<bool>()) {
        to_set.emplace_back(negated, "false");
        continue;
      }
    }
    if (flag == nullptr) {
      return UsageError(absl::StrCat("unknown flag --", name, "; --help lists every flag"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return UsageError(absl::StrCat("--", name, " needs a value"));
      }
    }
    to_set.emplace_back(flag, value);
  }
  for (auto& [flag, value] : to_set) {
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return UsageError(absl::StrCat("--", flag->Name(), "=", value, ": ", error));
    }
  }
  return out;
}

std::string FlagsHelp(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::string out = absl::StrCat(absl::ProgramUsageMessage(), "\n\nFlags:\n");
  std::map<std::string, absl::CommandLineFlag*> sorted;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurs(*flag)) sorted.emplace(std::string(name), flag);
  }
  for (const auto& [name, flag] : sorted) {
    absl::StrAppend(&out, "  --", name, "  ", flag->Help(),
                    " (default: ", flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(),
                    ")\n");
  }
  for (const auto& [name, help] : extra) absl::StrAppend(&out, "  --", name, "  ", help, "\n");
  absl::StrAppend(&out, "  --help  this text\n");
  return out;
}

CommandLine ParseFlagsOrExit(int argc, char** argv, const char* program, bool dotted,
                             const std::set<std::string>& repeated) {
  CommandLine line = ParseFlags(argc, argv, dotted, repeated);
  if (line.outcome == CommandLine::Outcome::kHelp) {
    std::fputs(FlagsHelp().c_str(), stdout);
    std::exit(0);
  }
  if (line.outcome == CommandLine::Outcome::kUsageError) {
    std::fprintf(stderr, "%s: %s\n", program, line.error.c_str());
    std::exit(2);
  }
  return line;
}

}  // namespace dtrain

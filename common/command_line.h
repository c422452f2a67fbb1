// The three binaries' command-line parsing on top of absl's flag registry, with exit codes a
// script can trust: absl::ParseCommandLine exits 1 on --help and on a bad flag, where our
// documented codes are 0 for help and 2 for a usage error. Flag names accept '-' for '_'
// (users type --heartbeat-timeout; absl flags are identifiers), bools take --x, --x=true or
// --nox, and the dtrain CLI's dotted job overrides (--trainer.max_epochs=5) and repeated
// options (--config a.yaml --config b.yaml) are handed back in order rather than refused.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

struct CommandLine {
  enum class Outcome { kRun, kHelp, kUsageError };
  Outcome outcome = Outcome::kRun;
  std::string error;                    // kUsageError: what was wrong, naming the flag
  std::vector<std::string> positional;  // without argv[0]
  // `--a.b=v` / `--a.b v` and the names in `repeated`, in the order given.
  std::vector<std::pair<std::string, std::string>> options;
};

// Sets the registered absl flags from argv. Nothing is set when the outcome is not kRun.
// `dotted`: accept --section.key[=]value as an option instead of refusing it as unknown.
CommandLine ParseFlags(int argc, char** argv, bool dotted = false,
                       const std::set<std::string>& repeated = {});

// The program's usage message, then every flag the program defines (not absl's own) with its
// help text and default, and `extra` (options ParseFlags hands back: name, help), for --help.
std::string FlagsHelp(const std::vector<std::pair<std::string, std::string>>& extra = {});

// The mains' common path: parse; print help and exit 0 on --help; print the error and exit 2
// on a usage error. Returns the positional arguments otherwise.
CommandLine ParseFlagsOrExit(int argc, char** argv, const char* program, bool dotted = false,
                             const std::set<std::string>& repeated = {});

}  // namespace dtrain

// absl flags are identifiers (--heartbeat_timeout); users type --heartbeat-timeout. Our mains
// accept both by rewriting flag names before absl parses them.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// Returns argv with '-' in flag names (not values) turned into '_'; `store` owns the strings.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& store);

}  // namespace dtrain

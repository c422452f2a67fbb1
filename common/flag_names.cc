#include "common/flag_names.h"

namespace dtrain {

std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& store) {
  store.assign(argv, argv + argc);
  for (size_t i = 1; i < store.size(); ++i) {
    std::string& arg = store[i];
    if (arg.rfind("--", 0) != 0) continue;
    const size_t end = arg.find('=') == std::string::npos ? arg.size() : arg.find('=');
    for (size_t j = 2; j < end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  std::vector<char*> out;
  for (std::string& s : store) out.push_back(s.data());
  return out;
}

}  // namespace dtrain

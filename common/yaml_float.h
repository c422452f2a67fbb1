// Floats as YAML text for the files users read with Python (hparams.yaml, `dtrain fit
// --print_config`): the shortest decimal that reads back as exactly the same value, in a form
// that YAML 1.1 (PyYAML's yaml.safe_load, which Lightning's users read hparams.yaml with) takes
// for a float. yaml-cpp's emitter writes a double at a fixed precision instead (0.05 as
// 0.050000000000000003 at 17 digits, lossily at fewer) and its "1e-05" or "32" would read back
// as a string or an int.
#pragma once

#include <string>

namespace dtrain {

// 0.05 -> "0.05", 32.0 -> "32.0", 1e-05 -> "1.0e-05", NaN -> ".nan", -inf -> "-.inf".
std::string YamlFloat(double value);
// A float field's value at float's precision (0.1f -> "0.1", not 0.10000000149011612).
std::string YamlFloat(float value);

}  // namespace dtrain

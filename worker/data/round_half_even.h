// Python's round() as torchvision's sizes and crop offsets use it, so that a transform's
// geometry is torchvision's to the pixel.
#pragma once

#include <cmath>

namespace dtrain {

// Half to even (the default floating-point rounding mode, which the worker never changes), then
// int(): round(0.5) is 0 and round(1.5) is 2, as in Python, where std::round would give 1 and 2.
inline int RoundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

}  // namespace dtrain

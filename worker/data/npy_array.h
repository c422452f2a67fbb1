// NumPy's .npy format (numpy.save), parsed by hand from untrusted bytes: a WebDataset sample's
// `.npy` field. Versions 1.0, 2.0 and 3.0 of the format; the header, a Python dict literal such
// as {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }, is read with a grammar that
// accepts only what numpy writes (never evaluated). Every length is checked against the bytes
// present before anything is sized from it. Plain C++ (no libtorch): turning the array into a
// tensor is worker/data/sample_fields.h's job.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

inline constexpr int kNpyMaxDims = 8;
inline constexpr int64_t kNpyMaxDim = int64_t{1} << 31;
inline constexpr int64_t kNpyMaxHeaderBytes = int64_t{64} << 10;

struct NpyArray {
  // "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32" or "float64".
  std::string dtype;
  int64_t item_bytes = 0;
  std::vector<int64_t> shape;  // empty for a 0-d array (one element)
  // True when `data` holds the elements in column-major order (np.asfortranarray); the reader
  // reverses the shape and transposes.
  bool fortran_order = false;
  // The elements, little-endian, exactly item_bytes * product(shape) bytes: a view into the
  // parsed input, valid as long as it is.
  absl::string_view data;
};

// The array in `bytes`, a whole .npy file. INVALID_ARGUMENT with the reason: not .npy (magic),
// an unknown format version, a header over kNpyMaxHeaderBytes or beyond the end, a header that is
// not the dict numpy writes, a dtype outside the list above (big-endian, unsigned wider than a
// byte, complex, strings, structured and object arrays, which need pickle, are refused), more
// than kNpyMaxDims dimensions, a dimension over kNpyMaxDim, or data bytes that differ from what
// the shape needs.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes);

}  // namespace dtrain

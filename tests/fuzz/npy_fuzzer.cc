// libFuzzer target: a WebDataset sample's .npy field through ParseNpy (worker/data/npy_array.h).
// A crash, a sanitizer report, or an accepted array whose data is not exactly item_bytes times
// its element count, lies outside the input, or has more dimensions or a larger dimension than
// the limits is a finding. Seeds in tests/fuzz/corpus/npy/ were written by numpy.save (python3
// tests/fuzz/make_npy_corpus.py). Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "worker/data/npy_array.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dtrain::NpyArray> array = dtrain::ParseNpy(input);
  if (!array.ok()) {
    if (array.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (array->shape.size() > static_cast<size_t>(dtrain::kNpyMaxDims)) std::abort();
  uint64_t elements = 1;
  for (int64_t dim : array->shape) {
    if (dim < 0 || dim > dtrain::kNpyMaxDim) std::abort();
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements)) std::abort();
  }
  if (elements * static_cast<uint64_t>(array->item_bytes) != array->data.size()) std::abort();
  if (array->data.data() < input.data() ||
      array->data.data() + array->data.size() > input.data() + input.size()) {
    std::abort();
  }
  // Touch every byte, so ASan sees a view that strays.
  unsigned sum = 0;
  for (char c : array->data) sum += static_cast<unsigned char>(c);
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}

// libFuzzer target: an IDX file's bytes (already inflated) through ReadIdx
// (worker/data/idx_file.h), with a small value bound so that huge declared shapes are found
// quickly. A crash, a sanitizer report, an error other than INVALID_ARGUMENT, or an accepted
// array whose values are not exactly the product of its shape, or are more than the bound, is a
// finding. Seeds in tests/fuzz/corpus/idx/: a small valid array, a header whose dimensions
// overflow, and a truncated one. Built and run by tests/fuzz/run.sh.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "worker/data/idx_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kBound = 1 << 20;
  size_t at = 0;
  const dtrain::IdxRead read = [&](char* out, int64_t n) -> int64_t {
    const size_t take = std::min<size_t>(static_cast<size_t>(n), size - at);
    if (take > 0) std::memcpy(out, data + at, take);
    at += take;
    return static_cast<int64_t>(take);
  };
  absl::StatusOr<dtrain::IdxArray> array = dtrain::ReadIdx(read, "fuzz.idx", kBound);
  if (!array.ok()) {
    if (array.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  uint64_t count = 1;
  for (int64_t d : array->shape) {
    if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) std::abort();
  }
  if (count != array->data.size() || count > static_cast<uint64_t>(kBound)) std::abort();
  return 0;
}

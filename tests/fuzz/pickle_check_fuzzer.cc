// libFuzzer target: bytes as a torch.save file's data.pkl through CheckPickle
// (worker/model/pickle_check.h), the gate before libtorch's unpickler. A crash, a sanitizer
// report or an error other than INVALID_ARGUMENT is a finding (the depth bound is 16 here, so
// that deep inputs are reached quickly). Seeds in tests/fuzz/corpus/pickle_check/ were written
// by Python's pickle at protocol 2. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>

#include "worker/model/pickle_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const absl::Status status = dtrain::CheckPickle(input, 16);
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}

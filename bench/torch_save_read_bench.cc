// What the torch.save reader's checks cost (issue 38): one file read from memory by dtrain's
// ParseTorchSave (the pickle rewrite, CheckPickle, declared storage sizes against their records,
// every tensor view against its storage) and by libtorch's own torch::pickle_load (none of
// those checks), alternating rounds in one process. Prints one JSON object per round.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/serialize.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "worker/model/torch_save_file.h"

ABSL_FLAG(std::string, file, "", "a torch.save file (bench/torch_save_read.sh writes one)");
ABSL_FLAG(int, rounds, 3, "alternating rounds");

namespace {

template <typename F>
double Seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::ifstream in(absl::GetFlag(FLAGS_file), std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  const std::vector<char> copy(bytes.begin(), bytes.end());
  if (bytes.empty()) {
    std::fprintf(stderr, "cannot read --file\n");
    return 2;
  }
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    size_t dtrain_tensors = 0, libtorch_tensors = 0;
    const double dtrain = Seconds([&] {
      absl::StatusOr<c10::IValue> v = dtrain::ParseTorchSave(bytes, "bench");
      if (!v.ok()) {
        std::fprintf(stderr, "%s\n", std::string(v.status().message()).c_str());
        std::exit(1);
      }
      dtrain_tensors = v->toGenericDict().size();
    });
    const double libtorch = Seconds([&] {
      c10::IValue v = torch::pickle_load(copy);
      libtorch_tensors = v.toGenericDict().size();
    });
    std::printf(
        "{\"round\": %d, \"mib\": %.0f, \"tensors\": %zu, \"dtrain_s\": %.3f, "
        "\"libtorch_s\": %.3f, \"ratio\": %.3f, \"same_count\": %s}\n",
        round, static_cast<double>(bytes.size()) / (1 << 20), dtrain_tensors, dtrain, libtorch,
        dtrain / libtorch, dtrain_tensors == libtorch_tensors ? "true" : "false");
    std::fflush(stdout);
  }
  return 0;
}

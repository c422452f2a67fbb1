// An example accelerator plugin (docs/extending.md): "gradient_watch" is the CPU accelerator
// plus a watch on the gradients, as a user's monitoring would keep one. At each training batch's
// start it records the gradients the step before it left, to
// $RECORDING_DDP_DIR/gradients-rank-<global rank>.log (when the variable is set):
// "<batch_idx> <nonzero elements> <SHA-256 of the gradients' bytes, in parameter order>". Both
// are exact whatever the threads: a float sum's last bit would depend on how it was split.
//
// Such a hook reads .grad between a call's steps, where no scan of the model sees it: ddp's
// split step must then leave the averaged gradients on every rank (tests/plugins_e2e_test.cc).
#include "examples/plugins/gradient_watch.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/sha256.h"
#include "worker/runtime/accelerator.h"

namespace example {
namespace {

class GradientWatch : public dtrain::CPUAccelerator {
 public:
  std::string name() const override { return "gradient_watch"; }

  absl::Status OnTrainBatchStart(int64_t batch_idx) override {
    if (const char* dir = std::getenv("RECORDING_DDP_DIR"); dir != nullptr) {
      int64_t nonzero = 0;
      dtrain::Sha256 hash;
      try {
        for (const torch::Tensor& p : model().Parameters()) {
          if (!p.grad().defined()) continue;
          const torch::Tensor g = p.grad().contiguous();
          nonzero += g.count_nonzero().item<int64_t>();
          hash.Update(absl::string_view(static_cast<const char*>(g.data_ptr()), g.nbytes()));
        }
      } catch (const std::exception& e) {  // c10::Error included: no exception leaves a plugin
        return absl::InternalError(absl::StrCat("gradient_watch: ", e.what()));
      }
      std::ofstream out(absl::StrCat(dir, "/gradients-rank-", strategy().global_rank(), ".log"),
                        std::ios::app);
      out << batch_idx << " " << nonzero << " " << hash.Finish() << "\n";
      if (!out.good()) {
        return absl::InternalError(absl::StrCat("gradient_watch: cannot write to ", dir));
      }
    }
    return CPUAccelerator::OnTrainBatchStart(batch_idx);
  }
};

}  // namespace

void RegisterGradientWatch(dtrain::PluginRegistry& registry) {
  (void)registry.AddAccelerator(
      "gradient_watch", "cpu",
      [](const dtrain::DevicePlan&) -> absl::StatusOr<std::unique_ptr<dtrain::Accelerator>> {
        return std::unique_ptr<dtrain::Accelerator>(new GradientWatch());
      },
      "the CPU accelerator, recording the gradients' digest at each training batch's start "
      "(examples/plugins)");
}

}  // namespace example

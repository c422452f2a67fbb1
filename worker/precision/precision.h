// Precision plugins, as Lightning names them:
//   "32-true"    float32 parameters and compute (default; alias "32")
//   "64-true"    float64 parameters and floating inputs (alias "64")
//   "bf16-mixed" float32 parameters, steps run under autocast to bfloat16 on the device's kind
//                (CPU or CUDA) (alias "bf16")
//   "bf16-true"  bfloat16 parameters and floating inputs
//   "16-mixed"   CUDA autocast to float16 plus dynamic loss scaling (alias "16"). libtorch 1.13
//                has no float16 autocast on CPU, so on a CPU device it is refused with a clear
//                error; its LossScaler is complete and tested on its own.
// Which autocast a precision enables on which device is decided in worker/precision/device_plan.h.
//
// Thread-safety: autocast state is thread-local; a plugin is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "worker/model/lightning_module.h"

namespace dtrain {

class PluginRegistry;

enum class Precision { k32True, k64True, kBf16Mixed, kBf16True, k16Mixed };

// Accepts Lightning's names and short aliases; INVALID_ARGUMENT lists them otherwise.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);
std::string PrecisionName(Precision precision);

// Dynamic loss scaling, with torch.cuda.amp.GradScaler's arithmetic: the scale is a float32
// tensor the loss is multiplied by (so a float16 loss is scaled in float32); gradients are
// unscaled by the float32 of the scale's float64 reciprocal, once a step, before clipping and the
// optimizer step; a step whose gradients held inf/nan before unscaling is skipped and the scale
// backs off; after `growth_interval` clean steps it grows, unless growing overflows float32.
class LossScaler {
 public:
  struct Options {
    double initial_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };
  LossScaler() : LossScaler(Options()) {}
  explicit LossScaler(Options options);

  // loss * scale, as a one-element float32 tensor on the loss's device (GradScaler.scale).
  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Divides every gradient by the scale; returns whether any held inf or nan. The check stays on
  // each device (one flag per device, CUDA's fused kernel there) and is read once: one host
  // sync a step, not one per parameter. FAILED_PRECONDITION for float16 gradients, which
  // GradScaler refuses too: 16-mixed keeps float32 parameters.
  absl::StatusOr<bool> Unscale(const std::vector<torch::Tensor>& parameters);
  // Records the step's outcome: skipped (found_inf) backs off, clean steps grow the scale.
  void Update(bool found_inf);

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  const Options& options() const { return options_; }
  // For checkpoints: the whole state is (scale, growth_tracker).
  void Restore(double scale, int64_t growth_tracker);

 private:
  Options options_;
  double scale_;
  int64_t growth_tracker_ = 0;
};

// The autocast a step runs under (PlanDevices decides it).
struct AutocastPlan {
  bool enabled = false;
  c10::DeviceType device = torch::kCPU;  // whose autocast: CPU's or CUDA's
  torch::ScalarType dtype = torch::kFloat;
  bool loss_scaling = false;  // 16-mixed: a LossScaler
};

// Subclassable by a plugin (worker/plugins/plugin_registry.h): ConnectModule and ConvertInput are
// its hooks; the autocast and loss scaling are the plan's.
class PrecisionPlugin {
 public:
  virtual ~PrecisionPlugin() = default;
  // FAILED_PRECONDITION when the device cannot run the precision (16-mixed on CPU).
  static absl::StatusOr<std::unique_ptr<PrecisionPlugin>> Make(Precision precision,
                                                               torch::Device device);
  // With the autocast PlanDevices chose.
  static std::unique_ptr<PrecisionPlugin> Make(Precision precision, const AutocastPlan& autocast);
  const AutocastPlan& autocast() const { return autocast_; }

  Precision precision() const { return precision_; }
  // The dtype parameters have under this precision.
  torch::ScalarType ParameterDType() const;

  // Casts the module's parameters (64-true, bf16-true); a no-op otherwise.
  virtual void ConnectModule(LightningModule& module) const;
  // Casts floating tensors of a batch (tensors, tuples, lists, dicts, nested) to the
  // parameter dtype for the "-true" precisions; other tensors are left alone.
  virtual c10::IValue ConvertInput(const c10::IValue& batch) const;

  // Runs a step under this precision (autocast for the mixed ones).
  template <typename F>
  auto Run(F&& step) const -> decltype(step()) {
    AutocastScope scope(autocast_);
    return step();
  }

  // 16-mixed only; null otherwise.
  LossScaler* scaler() { return scaler_.get(); }

 private:
  // Enables the plan's autocast (CPU's or CUDA's) for the lifetime of the scope and restores
  // the previous state.
  class AutocastScope {
   public:
    explicit AutocastScope(const AutocastPlan& plan);
    ~AutocastScope();

   private:
    bool active_ = false;
    c10::DeviceType device_ = torch::kCPU;
    bool previous_enabled_ = false;
    torch::ScalarType previous_dtype_ = torch::kBFloat16;
  };

 protected:
  PrecisionPlugin(Precision precision, const AutocastPlan& autocast);

 private:
  Precision precision_;
  AutocastPlan autocast_;
  std::unique_ptr<LossScaler> scaler_;
};

// dtrain's own precision plugins (32-true, 16-mixed, bf16-mixed, ...), added to `registry`.
void RegisterBuiltinPrecisions(PluginRegistry& registry);

}  // namespace dtrain

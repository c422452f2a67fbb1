#include "worker/precision/precision.h"

#include <algorithm>
#include <cmath>

#include <ATen/autocast_mode.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/plugin_catalog.h"
#include "common/status_macros.h"
#include "worker/model/batch_tree.h"
#include "worker/plugins/plugin_registry.h"
#include "worker/precision/device_plan.h"

namespace dtrain {

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  // The catalog's names and aliases (common/plugin_catalog.h); the enum is this file's own.
  const PluginCatalogEntry* own = FindInCatalog("precision", name);
  for (Precision p : {Precision::k32True, Precision::k64True, Precision::kBf16Mixed,
                      Precision::kBf16True, Precision::k16Mixed}) {
    if (own != nullptr && own->name == PrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown precision '", name, "'; use ",
                                                 absl::StrJoin(CatalogNames("precision"), ", ")));
}

std::string PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::k32True:
      return "32-true";
    case Precision::k64True:
      return "64-true";
    case Precision::kBf16Mixed:
      return "bf16-mixed";
    case Precision::kBf16True:
      return "bf16-true";
    case Precision::k16Mixed:
      return "16-mixed";
  }
  return "unknown";
}

LossScaler::LossScaler(Options options)
    : options_(options), scale_(static_cast<float>(options.initial_scale)) {}

torch::Tensor LossScaler::Scale(const torch::Tensor& loss) const {
  // A one-element float32 tensor, as GradScaler's _scale: a float16 loss is promoted to float32
  // instead of overflowing at the default scale (65536 > float16's largest, 65504).
  return loss * torch::full({1}, scale_, loss.options().dtype(torch::kFloat32));
}

absl::StatusOr<bool> LossScaler::Unscale(const std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  // GradScaler's inv_scale: the reciprocal in float64 of the float32 scale, then float32.
  const float inverse = static_cast<float>(1.0 / static_cast<double>(static_cast<float>(scale_)));
  struct OnDevice {
    torch::Device device;
    torch::Tensor found_inf;  // float32 [1], nonzero once a gradient held inf or nan
    std::vector<torch::Tensor> grads;
  };
  std::vector<OnDevice> devices;
  for (const torch::Tensor& p : parameters) {
    torch::Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (grad.scalar_type() == torch::kHalf) {
      return absl::FailedPreconditionError(
          "16-mixed cannot unscale float16 gradients (GradScaler refuses them too): keep the "
          "model's parameters float32; autocast computes in float16 where it is safe");
    }
    // In place, as GradScaler: an uncoalesced gradient's values, duplicates and all (coalescing
    // would unscale a copy and leave the gradient scaled).
    if (grad.is_sparse()) grad = grad._values();
    auto it = std::find_if(devices.begin(), devices.end(),
                           [&](const OnDevice& d) { return d.device == grad.device(); });
    if (it == devices.end()) {
      devices.push_back(
          {grad.device(), torch::zeros({1}, grad.options().dtype(torch::kFloat32)), {}});
      it = devices.end() - 1;
    }
    it->grads.push_back(grad);
  }
  for (OnDevice& d : devices) {
    if (d.device.is_cuda()) {
      at::_amp_foreach_non_finite_check_and_unscale_(
          d.grads, d.found_inf, torch::full({1}, inverse, d.found_inf.options()));
      continue;
    }
    // The same kernel's meaning, composed: the check sees each value before it is unscaled.
    for (torch::Tensor& grad : d.grads) {
      d.found_inf.add_(torch::logical_not(torch::isfinite(grad)).any());
      grad.mul_(inverse);
    }
  }
  bool found_inf = false;
  for (const OnDevice& d : devices) found_inf |= d.found_inf.item<float>() != 0;
  return found_inf;
}

void LossScaler::Update(bool found_inf) {
  // _amp_update_scale_'s arithmetic: the scale is float32, and growing it to inf is not done.
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void LossScaler::Restore(double scale, int64_t growth_tracker) {
  scale_ = static_cast<float>(scale);  // GradScaler's scale is a float32 tensor
  growth_tracker_ = growth_tracker;
}

PrecisionPlugin::PrecisionPlugin(Precision precision, const AutocastPlan& autocast)
    : precision_(precision), autocast_(autocast) {
  if (autocast.loss_scaling) scaler_ = std::make_unique<LossScaler>();
}

absl::StatusOr<std::unique_ptr<PrecisionPlugin>> PrecisionPlugin::Make(Precision precision,
                                                                       torch::Device device) {
  DeviceTable table;  // the device given is the table: it exists
  table.cuda_built = device.is_cuda();
  table.cuda_devices = device.is_cuda() ? device.index() + 1 : 0;
  DeviceRequest request;
  request.accelerator = device.is_cuda() ? "gpu" : "cpu";
  request.precision = precision;
  request.local_rank = device.is_cuda() ? device.index() : 0;
  DTRAIN_ASSIGN_OR_RETURN(DevicePlan plan, PlanDevices(request, table));
  return Make(precision, plan.autocast);
}

std::unique_ptr<PrecisionPlugin> PrecisionPlugin::Make(Precision precision,
                                                       const AutocastPlan& autocast) {
  return std::unique_ptr<PrecisionPlugin>(new PrecisionPlugin(precision, autocast));
}

void RegisterBuiltinPrecisions(PluginRegistry& registry) {
  for (const PluginCatalogEntry& entry : PluginCatalog("precision")) {
    if (!entry.refusal.empty()) continue;
    absl::StatusOr<Precision> precision = ParsePrecision(entry.name);
    absl::Status s = precision.status();
    if (s.ok()) {
      const Precision p = *precision;
      s = registry.AddPrecision(
          entry.name, p,
          [p](const AutocastPlan& autocast) -> absl::StatusOr<std::unique_ptr<PrecisionPlugin>> {
            return PrecisionPlugin::Make(p, autocast);
          },
          entry.description);
    }
    if (!s.ok()) {
      LogError(absl::StrCat("cannot register precision ", entry.name, ": ", s.ToString()));
    }
  }
}

torch::ScalarType PrecisionPlugin::ParameterDType() const {
  switch (precision_) {
    case Precision::k64True:
      return torch::kFloat64;
    case Precision::kBf16True:
      return torch::kBFloat16;
    default:
      return torch::kFloat32;
  }
}

void PrecisionPlugin::ConnectModule(LightningModule& module) const {
  if (precision_ == Precision::k64True || precision_ == Precision::kBf16True) {
    module.module().to(ParameterDType());
  }
}

c10::IValue PrecisionPlugin::ConvertInput(const c10::IValue& batch) const {
  if (precision_ != Precision::k64True && precision_ != Precision::kBf16True) return batch;
  return MapTensors(batch, [&](const at::Tensor& t) {
    return t.is_floating_point() ? t.to(ParameterDType()) : t;
  });
}

PrecisionPlugin::AutocastScope::AutocastScope(const AutocastPlan& plan) {
  if (!plan.enabled) return;
  active_ = true;
  device_ = plan.device;
  if (device_ == torch::kCUDA) {
    previous_enabled_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(plan.dtype);
    at::autocast::set_enabled(true);
  } else {
    previous_enabled_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(plan.dtype);
    at::autocast::set_cpu_enabled(true);
  }
  at::autocast::increment_nesting();
}

PrecisionPlugin::AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_ == torch::kCUDA) {
    at::autocast::set_enabled(previous_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
}

}  // namespace dtrain

#include "worker/precision/device_plan.h"

#include <unistd.h>

#include <cstdlib>

#include <ATen/detail/CUDAHooksInterface.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/plugin_catalog.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

absl::Status CudaUsable(const DeviceTable& table) {
  if (!table.cuda_built) {
    return absl::FailedPreconditionError(
        "accelerator 'gpu' requested, but this libtorch build has no CUDA support (Debian's "
        "libtorch-dev is a CPU build); use accelerator 'cpu' or build the worker against a CUDA "
        "libtorch (docs/worker.md)");
  }
  if (table.cuda_devices <= 0 && !table.nvidia_driver) {
    return absl::FailedPreconditionError(
        "accelerator 'gpu' requested, and this libtorch has CUDA, but no NVIDIA driver is loaded "
        "on this machine (/proc/driver/nvidia/version is missing; under WSL2 it always is, and "
        "the next causes apply): install the driver (nvidia-smi must list the GPUs) or use "
        "accelerator 'cpu'");
  }
  if (table.cuda_devices <= 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return absl::FailedPreconditionError(absl::StrCat(
        "accelerator 'gpu' requested: an NVIDIA driver is loaded, but libtorch sees no CUDA "
        "device. Causes: CUDA_VISIBLE_DEVICES hides them (here ",
        visible == nullptr ? "unset" : absl::StrCat("'", visible, "'"),
        "); a container started without its GPUs (docker --gpus, the Kubernetes device "
        "plugin); a driver older than this libtorch's CUDA needs. libtorch's own reason is the "
        "'CUDA initialization' warning in the worker's log. Use accelerator 'cpu' or make a GPU "
        "visible"));
  }
  return absl::OkStatus();
}

}  // namespace

DeviceTable DeviceTable::Detect() {
  DeviceTable table;
  // hasCUDART: the CUDA runtime is linked (a CUDA build), whether or not a driver answers;
  // hasCUDA is false without a driver, which must not be blamed on the build.
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
  table.cuda_built = cuda.hasCUDART() || cuda.hasCUDA();
  table.cuda_devices = cuda.hasCUDA() ? cuda.getNumGPUs() : 0;
  table.nvidia_driver = access("/proc/driver/nvidia/version", F_OK) == 0;
  return table;
}

absl::StatusOr<DeviceKind> ResolveAccelerator(const std::string& name, const DeviceTable& table) {
  // The catalog (common/plugin_catalog.h) knows the names, aliases and refusals; the device
  // kinds are this file's.
  const PluginCatalogEntry* own = FindInCatalog("accelerator", name);
  if (own != nullptr && !own->refusal.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("accelerator '", name, "' ", own->refusal));
  }
  const std::string planned = own != nullptr ? own->name : name;
  if (planned == "cpu") return DeviceKind::kCpu;
  if (planned == "gpu") {
    DTRAIN_RETURN_IF_ERROR(CudaUsable(table));
    return DeviceKind::kGpu;
  }
  if (planned == "auto") return CudaUsable(table).ok() ? DeviceKind::kGpu : DeviceKind::kCpu;
  return absl::InvalidArgumentError(absl::StrCat("unknown accelerator '", name, "'; use ",
                                                 absl::StrJoin(CatalogNames("accelerator"), ", ")));
}

absl::StatusOr<DeviceKind> ResolveAccelerator(const std::string& name) {
  return ResolveAccelerator(name, DeviceTable::Detect());
}

absl::StatusOr<DevicePlan> PlanDevices(const DeviceRequest& request, const DeviceTable& table) {
  DevicePlan plan;
  DTRAIN_ASSIGN_OR_RETURN(plan.kind, ResolveAccelerator(request.accelerator, table));
  const int replicas = request.data_parallel ? request.devices : 1;
  if (replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp needs at least one device, got ", request.devices));
  }
  if (plan.kind == DeviceKind::kGpu) {
    if (request.data_parallel) {
      if (replicas > table.cuda_devices) {
        return absl::FailedPreconditionError(absl::StrCat(
            "dp with ", replicas, " replicas needs ", replicas, " CUDA devices; this worker has ",
            table.cuda_devices, " (set trainer.devices to at most ", table.cuda_devices, ")"));
      }
      for (int i = 0; i < replicas; ++i) plan.replicas.emplace_back(torch::kCUDA, i);
    } else {
      if (request.local_rank < 0 || request.local_rank >= table.cuda_devices) {
        return absl::FailedPreconditionError(
            absl::StrCat("local rank ", request.local_rank, " needs CUDA device ",
                         request.local_rank, "; this host has ", table.cuda_devices,
                         " (run at most as many ranks per host as it has GPUs)"));
      }
      plan.replicas.emplace_back(torch::kCUDA, request.local_rank);
    }
  } else {
    // On the CPU every replica is the CPU (dp keeps its semantics without a speedup).
    plan.replicas.assign(replicas, torch::Device(torch::kCPU));
  }
  plan.root = plan.replicas.front();
  const c10::DeviceType device_type = plan.root.type();
  switch (request.precision) {
    case Precision::k16Mixed:
      if (device_type != torch::kCUDA) {
        return absl::FailedPreconditionError(
            "precision 16-mixed needs a CUDA device: libtorch 1.13 has no float16 autocast on "
            "CPU. Use bf16-mixed on CPU");
      }
      plan.autocast = {true, torch::kCUDA, torch::kHalf, /*loss_scaling=*/true};
      break;
    case Precision::kBf16Mixed:
      plan.autocast = {true, device_type, torch::kBFloat16, /*loss_scaling=*/false};
      break;
    default:
      plan.autocast = {};
  }
  return plan;
}

int AutoDeviceCount(const DeviceTable& table) {
  return table.cuda_built && table.cuda_devices > 0 ? table.cuda_devices : 1;
}

}  // namespace dtrain

// Which devices a worker's ranks and replicas run on and how each precision runs there: the
// one place these choices are made, from the machine's device table, so that the CUDA path is
// correct by construction even though it cannot run where dtrain is tested (no GPU, a CPU
// build of libtorch). Unit-tested for a CPU-only table and a simulated table of CUDA devices.
//
// The rules, as Lightning's:
//   accelerator  cpu; gpu/cuda (needs a CUDA build and a device); auto (gpu when there is a
//                CUDA device, else cpu); tpu/ipu/hpu/mps refused, naming the runtime missing.
//   device       dp: replica i on cuda:i, refused when there are more replicas than devices;
//                other strategies: the rank's local rank picks cuda:<local_rank>, refused
//                when the host has fewer devices than local ranks (never two ranks silently
//                sharing one GPU).
//   precision    16-mixed autocasts to float16 on CUDA with dynamic loss scaling, and is
//                refused on CPU (libtorch 1.13 has no float16 CPU autocast); bf16-mixed
//                autocasts to bfloat16 on the device's kind (CPU or CUDA); the -true ones
//                cast parameters and inputs instead.
//
// Thread-safety: pure functions; DeviceTable::Detect asks libtorch.
#pragma once

#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "worker/precision/precision.h"

namespace dtrain {

enum class DeviceKind { kCpu, kGpu };

// What this machine offers.
struct DeviceTable {
  bool cuda_built = false;  // libtorch was built with CUDA (its runtime is linked)
  int cuda_devices = 0;     // CUDA devices libtorch can use
  // An NVIDIA kernel driver is loaded (/proc/driver/nvidia/version): with a CUDA build and no
  // device, it tells a missing driver from devices hidden by CUDA_VISIBLE_DEVICES.
  bool nvidia_driver = false;
  // From the libtorch this process runs on.
  static DeviceTable Detect();
};

// The accelerator's device kind. FAILED_PRECONDITION for gpu without CUDA (saying whether
// libtorch lacks CUDA support or the machine lacks a device) and for the accelerators that
// need another runtime (tpu: XLA); INVALID_ARGUMENT for unknown names.
absl::StatusOr<DeviceKind> ResolveAccelerator(const std::string& name, const DeviceTable& table);
// The same, on this machine.
absl::StatusOr<DeviceKind> ResolveAccelerator(const std::string& name);

struct DeviceRequest {
  std::string accelerator;  // as the job spec names it
  Precision precision = Precision::k32True;
  bool data_parallel = false;  // dp: `devices` replicas in this process
  int devices = 1;             // dp: replicas
  int local_rank = 0;          // the rank's index among the ranks on its host
};

struct DevicePlan {
  DeviceKind kind = DeviceKind::kCpu;
  torch::Device root = torch::kCPU;  // where the model's parameters live
  // dp: one device per replica (replica 0 on root); otherwise {root}.
  std::vector<torch::Device> replicas;
  AutocastPlan autocast;  // what a step runs under
};

// The one decision: INVALID_ARGUMENT / FAILED_PRECONDITION with a message naming what is
// missing when the request does not fit the table.
absl::StatusOr<DevicePlan> PlanDevices(const DeviceRequest& request, const DeviceTable& table);

// `--devices auto`: the CUDA devices when there are any, else 1 (the CPU).
int AutoDeviceCount(const DeviceTable& table);

}  // namespace dtrain

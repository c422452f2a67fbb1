// The device a thread's implicit CUDA work lands on (Lightning's setup_environment /
// torch.cuda.set_device). CUDA's current device is per host thread and starts at 0, so without
// this every rank's implicit allocations, contexts and streams would land on GPU 0 whatever its
// root device. Device-generic (c10's guard for the device's type), so it is tested on the CPU
// with a stand-in device type; a CPU device costs nothing.
//
// Thread-safety: a scope belongs to the thread that made it.
#pragma once

#include <c10/core/DeviceGuard.h>
#include <torch/types.h>

#include "absl/status/status.h"

namespace dtrain {

// Makes `device` current on this thread for the scope's life, then restores the previous one.
class CurrentDeviceScope {
 public:
  explicit CurrentDeviceScope(torch::Device device);
  CurrentDeviceScope(const CurrentDeviceScope&) = delete;
  CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;

  // Not OK when libtorch has no guard for the device's type (a CUDA device on a CPU build).
  const absl::Status& status() const { return status_; }

 private:
  c10::OptionalDeviceGuard guard_;
  absl::Status status_;
};

}  // namespace dtrain

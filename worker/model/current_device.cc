#include "worker/model/current_device.h"

#include "absl/strings/str_cat.h"

namespace dtrain {

CurrentDeviceScope::CurrentDeviceScope(torch::Device device) {
  if (device.is_cpu()) return;  // the CPU has no current device
  try {
    guard_.reset_device(device);
  } catch (const c10::Error& e) {
    status_ = absl::FailedPreconditionError(absl::StrCat(
        "cannot make ", device.str(), " this thread's device: ", e.what_without_backtrace()));
  }
}

}  // namespace dtrain

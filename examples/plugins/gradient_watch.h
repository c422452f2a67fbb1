// The example library's accelerator "gradient_watch" (gradient_watch.cc), registered by the
// library's entry point (recording_ddp.cc).
#pragma once

#include "worker/plugins/plugin_registry.h"

namespace example {

void RegisterGradientWatch(dtrain::PluginRegistry& registry);

}  // namespace example

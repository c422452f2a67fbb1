// The libtorch headers the worker's translation units share, compiled once as a precompiled
// header (worker/CMakeLists.txt): parsing <torch/torch.h> costs 10-20 s per translation unit on
// this project's 2-core machines, and almost every worker file reaches it. Only the worker, its
// benches and its tests use it; the coordinator and client never see libtorch.
#pragma once

#include <ATen/ATen.h>
#include <torch/script.h>
#include <torch/torch.h>

// The seam of GradientLanding (gradient_landing.h) for code without libtorch headers: wraps the
// CPU allocator in the lending one (once; later calls do nothing). A process calls it at start,
// before other threads allocate, because libtorch does not synchronize the swap with
// allocations; otherwise the first GradientLanding does it.
#pragma once

namespace dtrain {

void InstallGradientLandingAllocator();

}  // namespace dtrain

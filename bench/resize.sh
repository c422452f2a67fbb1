#!/usr/bin/env bash
# The image resize alone (bench/resize_bench.cc): dtrain's vector path against its portable
# path in the same run, one thread, microseconds per 224x224 sample (the best of 5 passes).
#   bench/resize.sh [--samples N] [--reps N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deploy/install-deps.sh >&2  # the build's packages; the resize needs nothing else
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$root/build" --target dtrain-bench-resize >&2
"$root/build/bench/dtrain-bench-resize" "$@"

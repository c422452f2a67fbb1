#!/usr/bin/env bash
# HTTP limits benchmark: requests per second through dtrain's bounded HTTP server (the
# dashboard/API and /metrics) against cpp-httplib's own server, side by side in one process,
# alternating rounds; keep-alive clients and one connection per request.
#   bench/http_limits.sh [--clients N] [--seconds S] [--rounds R]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deploy/install-deps.sh >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON >&2
cmake --build "$build" --target dtrain-bench-http-limits >&2
"$build/bench/dtrain-bench-http-limits" "$@"

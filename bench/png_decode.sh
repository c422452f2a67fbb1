#!/usr/bin/env bash
# PNG decoding alone (bench/png_decode_bench.cc): dtrain's DecodeImage (plain PNGs inflated whole
# by libdeflate) against libpng's simplified API, and libdeflate's inflate alone as the floor,
# on one thread, over the images of bench/data_training.sh's Fashion-MNIST PNG shards (28x28
# gray; run that bench once first, or pass --shards DIR of shards with .png fields).
#   bench/png_decode.sh [--shards DIR] [--max_images N] [--passes N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deploy/install-deps.sh >&2
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$root/build" --target dtrain-bench-png-decode >&2
shards="${DTRAIN_BENCH_DATA:-/tmp/dtrain-bench-data}/fashion-png-55k"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards="$2"; shift ;;
    --max_images|--passes) args+=("$1=$2"); shift ;;
    *) echo "usage: bench/png_decode.sh [--shards DIR] [--max_images N] [--passes N]" >&2; exit 2 ;;
  esac
  shift
done
if [ ! -d "$shards" ]; then
  echo "no shards at $shards: run bench/data_training.sh once, or pass --shards DIR" >&2
  exit 1
fi
"$root/build/bench/dtrain-bench-png-decode" --shards="$shards" "${args[@]}"

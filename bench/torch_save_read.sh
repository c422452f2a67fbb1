#!/usr/bin/env bash
# torch.save reader benchmark: a 1 GiB file (256 float32 tensors of 4 MiB, written by Python's
# torch.save) parsed from memory by dtrain's checked reader and by libtorch's pickle_load,
# alternating rounds in one process.
#   bench/torch_save_read.sh [--mib N] [--rounds R]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mib=1024; rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --mib) mib="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    *) echo "usage: bench/torch_save_read.sh [--mib N] [--rounds R]" >&2; exit 2 ;;
  esac
  shift
done
deploy/install-deps.sh >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-bench-torch-save-read >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work/data.pt" "$mib" <<'PY'
import sys, torch
path, mib = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
torch.save({f"t{i}": torch.randn(1 << 20, generator=g) for i in range(mib // 4)}, path)
PY
"$build/bench/dtrain-bench-torch-save-read" --file="$work/data.pt" --rounds="$rounds"

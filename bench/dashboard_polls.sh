#!/bin/bash
# The dashboard's live views against a coordinator with a long history of ended jobs, one
# coordinator or two in alternated rounds: CPU per /api/v1/cluster request and per open event
# stream (bench/dashboard_polls.py says how). For a change against its parent, build the
# parent's coordinator beside:
#   git worktree add /tmp/dp-base HEAD~1 && cmake -S /tmp/dp-base -B /tmp/dp-base/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release -DDTRAIN_BUILD_WORKER=OFF -DDTRAIN_BUILD_TESTS=OFF && \
#     cmake --build /tmp/dp-base/build --target dtrain-coordinator
#   bench/dashboard_polls.sh --a /tmp/dp-base/build --b build --jobs 10000 --rounds 3
#   bench/dashboard_polls.sh [--a BUILD_DIR] [--b BUILD_DIR] [--jobs N] [--requests N]
#                            [--stream_seconds S] [--rounds N] [--json]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/dashboard_polls.sh [--a BUILD_DIR] [--b BUILD_DIR] [--jobs N] \
[--requests N] [--stream_seconds S] [--rounds N] [--json]"
a="$root/build"; b=""; extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --a|--b)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      dir=$(CDPATH='' cd -- "$2" && pwd) || exit 2
      if [ "$1" = --a ]; then a=$dir; else b=$dir; fi
      shift 2 ;;
    --jobs|--requests|--stream_seconds|--rounds)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; extra+=("$1" "$2"); shift 2 ;;
    --json) extra+=("$1"); shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
cd "$root"
for dir in "$a" ${b:+"$b"}; do
  [ "$dir" = "$root/build" ] || [ -x "$dir/coordinator/dtrain-coordinator" ] ||
    { echo "no coordinator/dtrain-coordinator under $dir: build it first" >&2; exit 2; }
done
deploy/install-deps.sh --bench >&2
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON >&2
# The coordinator, and the bench that seeds its database.
cmake --build "$root/build" --target dtrain-coordinator dtrain-bench-coordinator-scale >&2
sides=(--a "$a/coordinator/dtrain-coordinator")
[ -n "$b" ] && sides+=(--b "$b/coordinator/dtrain-coordinator")
exec /usr/bin/python3 "$root/bench/dashboard_polls.py" "${sides[@]}" \
  --seed "$root/build/bench/dtrain-bench-coordinator-scale" "${extra[@]}"

#!/bin/bash
# One large group formed against a coordinator, or two coordinators in alternated rounds: the
# formation's wall time, the coordinator's CPU and its peak memory growth (bench/group_formation.py
# says how). For a change against its parent, build the parent's coordinator beside:
#   git worktree add /tmp/gf-base HEAD~1 && cmake -S /tmp/gf-base -B /tmp/gf-base/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release -DDTRAIN_BUILD_WORKER=OFF -DDTRAIN_BUILD_TESTS=OFF && \
#     cmake --build /tmp/gf-base/build --target dtrain-coordinator
#   bench/group_formation.sh --a /tmp/gf-base/build --b build --ranks 4096 --rounds 3
#   bench/group_formation.sh [--a BUILD_DIR] [--b BUILD_DIR] [--ranks N] [--hosts N]
#                            [--rounds N] [--omit_members a|b] [--json]
# --omit_members b without --b: one coordinator, its ranks with and without the member list.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/group_formation.sh [--a BUILD_DIR] [--b BUILD_DIR] [--ranks 1-4096] \
[--hosts N] [--rounds 1-50] [--omit_members a|b] [--json]"
a="$root/build"; b=""; extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --a|--b)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      dir=$(CDPATH='' cd -- "$2" && pwd) || exit 2
      if [ "$1" = --a ]; then a=$dir; else b=$dir; fi
      shift 2 ;;
    --ranks|--hosts|--rounds|--omit_members)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; extra+=("$1" "$2"); shift 2 ;;
    --json) extra+=("$1"); shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
cd "$root"
# A side other than build/ is built by the caller: say so before installing or building.
for dir in "$a" ${b:+"$b"}; do
  [ "$dir" = "$root/build" ] || [ -x "$dir/coordinator/dtrain-coordinator" ] ||
    { echo "no coordinator/dtrain-coordinator under $dir: build it first" >&2; exit 2; }
done
deploy/install-deps.sh --bench >&2
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON >&2
# The coordinator, and the Python stubs the client imports.
cmake --build "$root/build" --target dtrain-coordinator dtrain_python >&2
sides=(--a "$a/coordinator/dtrain-coordinator")
[ -n "$b" ] && sides+=(--b "$b/coordinator/dtrain-coordinator")
PYTHONPATH="$root/build/python" exec /usr/bin/python3 "$root/bench/group_formation.py" \
  "${sides[@]}" "${extra[@]}"

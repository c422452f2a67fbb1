#!/usr/bin/env bash
# Times the README demo's build step, cold, from a fresh clone of each revision given (default:
# HEAD): exactly the configure and build lines of that revision's deploy/local/demo.sh, after
# its dependencies are installed. Run it on an idle machine; it prints one line per revision.
#   bench/build_time.sh [REV ...]        e.g. bench/build_time.sh 1ec9a02 HEAD
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/install-deps.sh"
revs=("$@")
[ ${#revs[@]} -eq 0 ] && revs=(HEAD)
for rev in "${revs[@]}"; do
  dir=$(mktemp -d /tmp/dtrain-build-time.XXXXXX)
  git clone -q "$root" "$dir/src"
  git -C "$dir/src" checkout -q "$(git -C "$root" rev-parse "$rev")"
  steps=$(sed -n '/^cmake -S/,/^cmake --build/p' "$dir/src/deploy/local/demo.sh")
  start=$(date +%s)
  (cd "$dir/src" && bash -euo pipefail -c "$steps" >"$dir/build.log" 2>&1)
  end=$(date +%s)
  echo "$rev $(git -C "$root" rev-parse --short "$rev"): $((end - start)) s"
  rm -rf "$dir"
done

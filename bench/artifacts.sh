#!/usr/bin/env bash
# Artifacts benchmark: one file (default 1 GiB of random bytes) uploaded to a fresh coordinator,
# uploaded again (only hashed and checked: nothing sent), and fetched back verified, with
# SHA-256 alone and loopback TCP measured in the same run as the limits.
#   bench/artifacts.sh [--mib N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mib=1024
while [ $# -gt 0 ]; do
  case "$1" in
    --mib) mib="$2"; shift ;;
    *) echo "usage: bench/artifacts.sh [--mib N]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-bench-artifacts dtrain-bench-loopback >&2

work=$(mktemp -d)
coordinator=""
cleanup() {
  [ -n "$coordinator" ] && kill "$coordinator" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

head -c "$((mib << 20))" /dev/urandom > "$work/file"
"$build/coordinator/dtrain-coordinator" --listen=127.0.0.1:0 --port_file="$work/port" \
  --state_dir="$work/state" 2>"$work/coordinator.log" &
coordinator=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done

: > "$work/rows.jsonl"
"$build/bench/dtrain-bench-loopback" >> "$work/rows.jsonl"
"$build/bench/dtrain-bench-artifacts" --coordinator="127.0.0.1:$(cat "$work/port")" \
  --file="$work/file" --fetch_to="$work/fetched" >> "$work/rows.jsonl"
cmp -s "$work/file" "$work/fetched" || { echo "the fetched copy differs" >&2; exit 1; }

python3 - "$work/rows.jsonl" "$mib" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
loop = next(r["algbw_gbps"] for r in rows if r.get("op") == "stream")
print(f"file: {sys.argv[2]} MiB of random bytes; loopback TCP (this run): {loop:.2f} GB/s")
print(f"{'operation':<24}{'seconds':>10}{'GB/s':>8}{'of loopback':>13}")
for r in rows:
    if r["system"] != "dtrain-artifacts":
        continue
    share = f"{r['gbps'] / loop * 100:.0f}%" if r["op"] in ("upload_first", "fetch_verified") else "-"
    print(f"{r['op']:<24}{r['seconds']:>10.2f}{r['gbps']:>8.2f}{share:>13}")
PY

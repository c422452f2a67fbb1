#!/usr/bin/env bash
# Collectives benchmark: barrier latency and all_reduce bandwidth, dtrain (gRPC through the
# coordinator) side by side with torch.distributed + gloo, in one run on this machine.
#   bench/collectives.sh [--json] [--quick] [--ranks "2 4"]
# Prints a table with the dtrain/gloo ratio per row (--json: one JSON object per row).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

json=0; quick=0; ranks="2 4"
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --quick) quick=1 ;;
    --ranks) ranks="$2"; shift ;;
    *) echo "usage: bench/collectives.sh [--json] [--quick] [--ranks \"2 4\"]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_WORKER=OFF >&2
cmake --build "$build" --target dtrain-coordinator dtrain-bench-collectives >&2

barriers=2000; seconds=3; sizes="4096,1048576,16777216,67108864"
if [ "$quick" = 1 ]; then barriers=200; seconds=0.5; sizes="4096,1048576"; fi

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$build/coordinator/dtrain-coordinator" --listen=127.0.0.1:0 --port_file="$work/port" \
  2>"$work/coordinator.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")

: > "$work/rows.jsonl"
for n in $ranks; do
  echo "dtrain-grpc, $n ranks ..." >&2
  rank_pids=()
  for r in $(seq 0 $((n - 1))); do
    "$build/bench/dtrain-bench-collectives" --coordinator="127.0.0.1:$port" --group="bench-$n" \
      --world_size="$n" --barriers="$barriers" --sizes="$sizes" --seconds_per_size="$seconds" \
      >"$work/dtrain-$n-$r.out" &
    rank_pids+=($!)
  done
  for p in "${rank_pids[@]}"; do wait "$p"; done
  cat "$work/dtrain-$n-"*.out >> "$work/rows.jsonl"

  echo "torch-gloo, $n ranks ..." >&2
  gloo_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  /usr/bin/python3 bench/torch_collectives.py --world_size="$n" --port="$gloo_port" \
    --barriers="$barriers" --sizes="$sizes" --seconds_per_size="$seconds" >> "$work/rows.jsonl"
done

if [ "$json" = 1 ]; then
  cat "$work/rows.jsonl"
else
  /usr/bin/python3 - "$work/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = lambda r: (r["op"], r["ranks"], r["bytes"])
gloo = {key(r): r for r in rows if r["system"] == "torch-gloo"}
print(f"{'op':<11}{'ranks':>6}{'bytes':>10} {'dtrain p50 us':>14}{'p99 us':>10}{'GB/s':>8}"
      f" {'gloo p50 us':>12}{'p99 us':>10}{'GB/s':>8}  {'dtrain/gloo':>11}")
for r in rows:
    if r["system"] != "dtrain-grpc":
        continue
    g = gloo.get(key(r))
    if r["op"] == "barrier":
        ratio = f"{r['p50_us'] / g['p50_us']:.2f}x time" if g else "-"
    else:
        ratio = f"{r['algbw_gbps'] / g['algbw_gbps']:.2f}x bw" if g else "-"
    gp = (f"{g['p50_us']:>12.1f}{g['p99_us']:>10.1f}{g['algbw_gbps']:>8.3f}" if g
          else f"{'-':>12}{'-':>10}{'-':>8}")
    print(f"{r['op']:<11}{r['ranks']:>6}{r['bytes']:>10} {r['p50_us']:>14.1f}{r['p99_us']:>10.1f}"
          f"{r['algbw_gbps']:>8.3f} {gp}  {ratio:>11}")
PY
fi

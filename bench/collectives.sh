#!/usr/bin/env bash
# Collectives benchmark: barrier latency, and all_reduce, broadcast and all_gather bandwidth
# (bytes a rank over the p50 time), dtrain's three data planes (dtrain-grpc: through the
# coordinator; dtrain-gloo: peer to peer over c10d's Gloo; dtrain-shm: shared memory between
# same-host ranks) side by side with torch.distributed + gloo, in one run on this machine, plus
# loopback TCP measured in the same run as the physical limit.
#   bench/collectives.sh [--json] [--quick] [--ranks "2 4"]
# Prints a table with the dtrain/torch ratios per row (--json: one JSON object per row).
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
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-bench-collectives \
  dtrain-bench-collectives-gloo dtrain-bench-loopback >&2

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
  --state-dir="$work/state" 2>"$work/coordinator.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")

: > "$work/rows.jsonl"
echo "loopback TCP ..." >&2
"$build/bench/dtrain-bench-loopback" >> "$work/rows.jsonl"
for n in $ranks; do
  for system in grpc gloo shm; do
    echo "dtrain-$system, $n ranks ..." >&2
    binary="$build/bench/dtrain-bench-collectives"
    [ "$system" != grpc ] && binary="$build/bench/dtrain-bench-collectives-gloo --backend=$system"
    rank_pids=()
    for r in $(seq 0 $((n - 1))); do
      $binary --coordinator="127.0.0.1:$port" --group="bench-$system-$n" \
        --world_size="$n" --barriers="$barriers" --sizes="$sizes" --seconds_per_size="$seconds" \
        >"$work/$system-$n-$r.out" &
      rank_pids+=($!)
    done
    for p in "${rank_pids[@]}"; do wait "$p"; done
    cat "$work/$system-$n-"*.out >> "$work/rows.jsonl"
  done

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
by = {(r["system"], r["op"], r["ranks"], r["bytes"]): r for r in rows}
loop_bw = next((r["algbw_gbps"] for r in rows if r["op"] == "stream"), None)
loop_rt = next((r["p50_us"] for r in rows if r["op"] == "round_trip"), None)
print(f"loopback TCP (this run): stream {loop_bw:.2f} GB/s, 1-byte round trip p50 {loop_rt:.1f} us")
systems = ["dtrain-grpc", "dtrain-gloo", "dtrain-shm", "torch-gloo"]
head = f"{'op':<11}{'ranks':>6}{'bytes':>10}"
for s in systems:
    head += f" {s + ' p50 us':>19}{'GB/s':>7}"
print(head + f"  {'grpc/torch':>11}{'gloo/torch':>11}{'shm/torch':>11}{'best/loopback':>14}")
keys = sorted({(r["op"], r["ranks"], r["bytes"]) for r in rows if r["system"] in systems},
              key=lambda k: (k[0] != "barrier", k[1], k[2], k[0]))
for op, n, b in keys:
    line = f"{op:<11}{n:>6}{b:>10}"
    got = {s: by.get((s, op, n, b)) for s in systems}
    for s in systems:
        r = got[s]
        line += f" {r['p50_us']:>19.1f}{r['algbw_gbps']:>7.3f}" if r else f" {'-':>19}{'-':>7}"
    t = got["torch-gloo"]
    def ratio(r):
        if not r or not t:
            return "-"
        if op == "barrier":
            return f"{r['p50_us'] / t['p50_us']:.2f}x t"
        return f"{r['algbw_gbps'] / t['algbw_gbps']:.2f}x bw"
    best = max((got[s]["algbw_gbps"] for s in systems[:3] if got[s]), default=0)
    share = f"{100 * best / loop_bw:.0f}%" if op == "all_reduce" and loop_bw else "-"
    print(line + f"  {ratio(got['dtrain-grpc']):>11}{ratio(got['dtrain-gloo']):>11}"
          f"{ratio(got['dtrain-shm']):>11}{share:>14}")
PY
fi

#!/usr/bin/env bash
# The coordinator at cluster scale, simulated on this machine: a real dtrain-coordinator whose
# database already holds --ended_jobs finished jobs, 1,000 simulated worker daemons (each its own
# gRPC connection, registering and heartbeating at the coordinator's interval), 32 jobs training
# on them (progress and metrics every step) and 200 queued behind them. Measures, over a steady
# window: heartbeat latency (p50/p99/max), the coordinator's CPU (share of one core) and memory,
# `dtrain list` and `dtrain workers` wall time, each beside a same-run reference from this
# machine (a loopback gRPC round trip with no work behind it, the simulator's own CPU, `dtrain --help`); then
# cancels the running jobs and checks that the queue drains in submission order. See
# bench/coordinator_scale_bench.cc.
#   bench/coordinator_scale.sh [--json] [--workers N] [--running N] [--queued N]
#                              [--nodes_per_job N] [--ended_jobs N] [--batch_ms N] [--window S]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
json=0
workers=1000 running=32 queued=200 nodes=31 ended=10000 batch_ms=100 window=40
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --workers) workers=$2; shift ;;
    --running) running=$2; shift ;;
    --queued) queued=$2; shift ;;
    --nodes_per_job) nodes=$2; shift ;;
    --ended_jobs) ended=$2; shift ;;
    --batch_ms) batch_ms=$2; shift ;;
    --window) window=$2; shift ;;
    *) echo "usage: bench/coordinator_scale.sh [--json] [--workers N] [--running N] [--queued N] [--nodes_per_job N] [--ended_jobs N] [--batch_ms N] [--window S]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain dtrain-bench-coordinator-scale >&2

# A connection per simulated worker, plus the coordinator's to them: raise the descriptor limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
work=$(mktemp -d)
coordinator_pid=""
cleanup() {
  if [ -n "$coordinator_pid" ]; then kill "$coordinator_pid" 2>/dev/null || true; wait "$coordinator_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "seeding $ended ended jobs ..." >&2
mkdir -p "$work/state"
"$build/bench/dtrain-bench-coordinator-scale" --seed_db="$work/state/coordinator.db" \
  --ended_jobs="$ended" >&2

"$build/coordinator/dtrain-coordinator" --listen=127.0.0.1:0 --port_file="$work/port" \
  --state_dir="$work/state" > "$work/coordinator.log" 2>&1 &
coordinator_pid=$!
for _ in $(seq 1 200); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "the coordinator did not start; its log:" >&2; cat "$work/coordinator.log" >&2; exit 1; }
address="127.0.0.1:$(cat "$work/port")"
echo "coordinator on $address (pid $coordinator_pid, log $work/coordinator.log); $(grep -c . "$work/coordinator.log") log lines so far" >&2

"$build/bench/dtrain-bench-coordinator-scale" --coordinator="$address" \
  --coordinator_pid="$coordinator_pid" --dtrain="$build/client/dtrain" --workers="$workers" \
  --running="$running" --queued="$queued" --nodes_per_job="$nodes" --batch_ms="$batch_ms" \
  --window="${window}s" > "$work/result.json"

if [ "$json" = 1 ]; then cat "$work/result.json"; exit 0; fi
/usr/bin/python3 - "$work/result.json" "$ended" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ended = int(sys.argv[2])
if r['reference_rtt_p50_ms'] > 0:
    ref = (f"loopback round trip with no work behind it {r['reference_rtt_p50_ms']:.2f} / {r['reference_rtt_p99_ms']:.2f} ms (p50 / p99); "
           f"ratio {r['heartbeat_p50_ms'] / r['reference_rtt_p50_ms']:.1f}x / {r['heartbeat_p99_ms'] / r['reference_rtt_p99_ms']:.1f}x")
else:
    ref = "n/a: every reference round trip failed"
if r['reference_rtt_failures']:
    ref += f" ({r['reference_rtt_failures']} reference calls failed)"
cpu_ref = (f"simulator (the other side) {r['simulator_cpu_pct']:.1f}%; "
           f"ratio {r['coordinator_cpu_pct'] / r['simulator_cpu_pct']:.2f}"
           if r['simulator_cpu_pct'] > 0 else "n/a")
cli_ref = f"`dtrain --help` {r['cli_start_ms_median']:.0f} ms"
rows = [
    ("simulated workers", f"{r['workers']} (registered in {r['register_s']:.1f} s)", "", ""),
    ("heartbeats in the window", f"{r['heartbeats_in_window']} every {r['heartbeat_interval_ms']:.0f} ms, {r['heartbeat_failures']} failed", "", ""),
    ("heartbeat latency p50 / p99 / max", f"{r['heartbeat_p50_ms']:.2f} / {r['heartbeat_p99_ms']:.2f} / {r['heartbeat_max_ms']:.1f} ms", "p99 < 20 ms", ref),
    ("jobs training in the window", f"{r['running_jobs']} x {r['nodes_per_job']} workers, {r['steps_at_window_end']} steps done", "", ""),
    ("coordinator CPU", f"{r['coordinator_cpu_pct']:.1f}% of one core", "< 30%", cpu_ref),
    ("coordinator RSS (peak)", f"{r['coordinator_rss_mib']:.0f} MiB ({r['coordinator_peak_rss_mib']:.0f} MiB)", "< 300 MB", ""),
    (f"dtrain list ({ended} ended jobs + the rest)", f"median {r['list_ms_median']:.0f} ms, max {r['list_ms_max']:.0f} ms", "< 100 ms", cli_ref),
    ("dtrain workers", f"median {r['workers_ms_median']:.0f} ms, max {r['workers_ms_max']:.0f} ms", "< 100 ms", cli_ref),
    ("queued jobs after the running ones end", f"{r['queued_succeeded']} of {r['queued_jobs']} succeeded, {r['queued_started_in_order']} started in submission order, {r['drain_s']:.0f} s", "FIFO", ""),
]
print(f"{'measured':44} {'value':58} {'target':12} same-run reference")
for what, value, target, reference in rows:
    print(f"{what:44} {value:58} {target:12} {reference}")
if r["first_failure"]:
    print(f"first queued job that did not succeed: {r['first_failure']}")
PY

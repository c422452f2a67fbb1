#!/usr/bin/env bash
# What rank isolation costs (dtrain-worker --rank_isolation; docs/OPERATIONS.md): the same
# 2-worker ddp job on Fashion-MNIST with each worker's rank in the daemon's process
# (in_process) and in a child process (process: the default for a worker with a token), side
# by side in one run, interleaved --runs times (default 5); the median samples/s of each and
# their ratio. The job's trainer rate covers its first step to its last, so the child's start
# (at Setup) is reported apart: each job's Setup-to-first-step time, from its phases.
#   bench/rank_isolation.sh [--runs N] [--model mlp|cnn]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
runs=5; model=mlp
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    *) echo "usage: bench/rank_isolation.sh [--runs N] [--model mlp|cnn]" >&2; exit 2 ;;
  esac
done
deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain >&2

declare -A steps=([mlp]=3000 [cnn]=200)
work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
cleanup() { deploy/local/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

source "$root/bench/bench_job.sh"
job() {  # mode run max_steps
  local id
  id=$(bench_job_submit "$build" --name="iso-$model" --model.builtin="$model" \
    --trainer.max_steps="$3")
  bench_job_wait "$build" "$id"
  "$build/client/dtrain" status "$id" --output json |
    /usr/bin/python3 -c "import json,sys; s=json.load(sys.stdin); p=s['progress']; print(json.dumps({'mode': '$1', 'run': $2, 'samples_per_s': round(p['samples_per_second'], 1), 'setup_s': round(float(p.get('phaseSeconds', p.get('phase_seconds', {})).get('setup', 0) or 0), 2), 'state': s['state']}))"
}

: > "$work/rows.jsonl"
for run in $(seq 1 "$runs"); do
  for mode in in_process process; do
    echo "run $run/$runs: $model, ranks $mode ..." >&2
    DTRAIN_WORKER_FLAGS="--rank_isolation=$mode" deploy/local/cluster.sh start --port 0 --workers 2 >&2
    export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
    job "$mode" 0 20 > /dev/null   # warm, as a long-lived daemon is
    job "$mode" "$run" "${steps[$model]}" >> "$work/rows.jsonl"
    deploy/local/cluster.sh stop >&2
  done
done
/usr/bin/python3 - "$work/rows.jsonl" "$model" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = [r for r in rows if r["state"] != "SUCCEEDED"]
if bad:
    sys.exit(f"jobs failed: {bad}")
med = {m: statistics.median(r["samples_per_s"] for r in rows if r["mode"] == m)
       for m in ("in_process", "process")}
setup = {m: statistics.median(r["setup_s"] for r in rows if r["mode"] == m)
         for m in ("in_process", "process")}
print(f"| ranks | {sys.argv[2]} samples/s (median of {len(rows) // 2}) | runs | Setup (median s) |")
print("| --- | --- | --- | --- |")
for m in ("in_process", "process"):
    runs = ", ".join(f"{r['samples_per_s']:.0f}" for r in rows if r["mode"] == m)
    print(f"| {m} | {med[m]:.0f} | {runs} | {setup[m]:.2f} |")
print(f"\nprocess / in_process: {med['process'] / med['in_process']:.3f}")
PY

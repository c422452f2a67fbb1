#!/usr/bin/env bash
# Training benchmark: samples/s on Fashion-MNIST for the zoo's CNN and MLP, in one run on this
# machine, side by side:
#   dtrain-grpc/-gloo/-shm      a dtrain job, 2 workers (one rank each), ddp, over each backend
#   torch-ddp-gloo              the same model in Python torch DistributedDataParallel + gloo
#   compute-ceiling             two independent plain libtorch loops at once, one thread and the
#                               per-rank batch each: 2 ranks' compute with no communication
#   libtorch-loop               one plain single-process loop, two threads, the global batch
# and dtrain's overhead at world size 1 (single_device on one worker, one thread) against the
# plain loop with the same batch and thread: samples/s and the CPU time of the whole run.
#   bench/training.sh [--json] [--quick]
# --json: one JSON object per row: system, model, ranks, samples_per_s (plus batch).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
json=0; quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --quick) quick=1 ;;
    *) echo "usage: bench/training.sh [--json] [--quick]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain dtrain-bench-train-loop >&2

batch=64                       # per rank
cores=$(nproc)
declare -A steps=([mlp]=600 [cnn]=200)
if [ "$quick" = 1 ]; then steps=([mlp]=100 [cnn]=30); fi

work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
cleanup() { deploy/local/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
: > "$work/rows.jsonl"

# Sums utime + stime (clock ticks) of the given processes.
cpu_ticks() {
  local total=0 pid
  for pid in "$@"; do
    total=$(( total + $(awk '{print $14 + $15}' "/proc/$pid/stat") ))
  done
  echo "$total"
}

# One dtrain job; its samples/s is the trainer's, from the first step to the last (after setup).
dtrain_job() {  # model backend strategy workers
  local model=$1 backend=$2 strategy=$3 workers=$4
  cat > "$work/job.yaml" <<JOB
name: bench-$model-$backend
model: {builtin: $model}
data: {builtin: fashion-mnist, batch_size: $batch, shuffle: false}
trainer: {max_steps: ${steps[$model]}, strategy: $strategy, num_nodes: $workers,
          collective_backend: $backend, val_check_interval: 1000000000, skip_test: true}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
JOB
  local id
  id=$("$build/client/dtrain" fit --output json --config "$work/job.yaml" | sed -n 's/^ *"id": "\([^"]*\)".*/\1/p' | head -1)
  "$build/client/dtrain" watch "$id" >/dev/null
  "$build/client/dtrain" status "$id" --output json |
    /usr/bin/python3 -c "import json,sys; s=json.load(sys.stdin); print(json.dumps({'system': 'dtrain-$backend' if $workers > 1 else 'dtrain-single', 'model': '$model', 'ranks': $workers, 'batch': $batch, 'samples_per_s': round(s['progress']['samples_per_second'], 1)}))"
}

for model in mlp cnn; do
  echo "$model: dtrain, 2 workers ..." >&2
  deploy/local/cluster.sh start --port 0 --workers 2 >&2
  export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
  dtrain_job "$model" grpc ddp 2 >> "$work/rows.jsonl"
  dtrain_job "$model" gloo ddp 2 >> "$work/rows.jsonl"
  dtrain_job "$model" shm ddp 2 >> "$work/rows.jsonl"
  deploy/local/cluster.sh stop >&2

  echo "$model: torch DDP + gloo, 2 ranks ..." >&2
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  /usr/bin/python3 bench/torch_training.py --model "$model" --world_size 2 --batch "$batch" \
    --steps "${steps[$model]}" --threads $(( cores / 2 > 0 ? cores / 2 : 1 )) --port "$port" >> "$work/rows.jsonl"

  echo "$model: compute ceiling: 2 independent plain loops, 1 thread each ..." >&2
  for i in 0 1; do
    "$build/bench/dtrain-bench-train-loop" --model "$model" --batch "$batch" --threads 1 \
      --steps "${steps[$model]}" > "$work/ceiling-$i.json" &
  done
  wait
  cat "$work/ceiling-0.json" "$work/ceiling-1.json" | /usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(json.dumps({'system': 'compute-ceiling', 'model': '$model', 'ranks': 2, 'batch': $batch,
                  'samples_per_s': round(sum(r['samples_per_s'] for r in rows), 1)}))" >> "$work/rows.jsonl"

  echo "$model: plain libtorch loop, global batch ..." >&2
  "$build/bench/dtrain-bench-train-loop" --model "$model" --batch $((2 * batch)) \
    --steps "${steps[$model]}" >> "$work/rows.jsonl"

  # World size 1, one compute thread on both sides. Besides samples/s (noisy here), the CPU
  # time both sides spend for the whole run (data loading and model set-up included on both
  # sides; dtrain: worker + coordinator), which other tenants of the machine do not inflate.
  echo "$model: world size 1, dtrain vs the plain loop ..." >&2
  deploy/local/cluster.sh start --port 0 --workers 1 --threads 1 >&2
  export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
  pids="$(cat "$DTRAIN_LOCAL_DIR/coordinator.pid") $(cat "$DTRAIN_LOCAL_DIR/worker-0.pid")"
  before=$(cpu_ticks $pids)
  dtrain_job "$model" grpc single_device 1 > "$work/single.json"
  after=$(cpu_ticks $pids)
  deploy/local/cluster.sh stop >&2
  /usr/bin/python3 -c "
import json, os
r = json.load(open('$work/single.json'))
r['cpu_s'] = round(($after - $before) / os.sysconf('SC_CLK_TCK'), 2)
r['samples'] = ${steps[$model]} * $batch
print(json.dumps(r))" >> "$work/rows.jsonl"
  /usr/bin/python3 -c "
import json, resource, subprocess, sys
out = subprocess.run(sys.argv[1:], check=True, capture_output=True, text=True).stdout
r = json.loads(out); u = resource.getrusage(resource.RUSAGE_CHILDREN)
r['system'] = 'libtorch-loop-1'; r['cpu_s'] = round(u.ru_utime + u.ru_stime, 2)
r['samples'] = ${steps[$model]} * $batch
print(json.dumps(r))" "$build/bench/dtrain-bench-train-loop" --model "$model" --batch "$batch" \
    --threads 1 --warmup 0 --steps "${steps[$model]}" >> "$work/rows.jsonl"
done

if [ "$json" = 1 ]; then cat "$work/rows.jsonl"; exit 0; fi
/usr/bin/python3 - "$work/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["system"], r["model"]): r for r in rows}
print(f"{'model':6} {'system':16} {'ranks':>5} {'batch/rank':>10} {'samples/s':>10}  {'vs torch DDP':>12}  {'of ceiling':>10}")
for model in ("mlp", "cnn"):
    peer = by.get(("torch-ddp-gloo", model), {}).get("samples_per_s")
    ceiling = by.get(("compute-ceiling", model), {}).get("samples_per_s")
    for system in ("dtrain-grpc", "dtrain-gloo", "dtrain-shm", "torch-ddp-gloo", "compute-ceiling",
                   "libtorch-loop"):
        r = by.get((system, model))
        if r is None:
            continue
        ratio = f"{r['samples_per_s'] / peer:.2f}x" if peer else ""
        share = f"{100 * r['samples_per_s'] / ceiling:.0f}%" if ceiling else ""
        batch = r["batch"] if system != "libtorch-loop" else f"{r['batch']} (1 rank)"
        print(f"{model:6} {system:16} {r['ranks']:>5} {batch:>10} {r['samples_per_s']:>10.0f}  {ratio:>12}  {share:>10}")
    single = by.get(("dtrain-single", model)); loop = by.get(("libtorch-loop-1", model))
    if single and loop:
        print(f"{model:6} world size 1, 1 thread: dtrain {single['samples_per_s']:.0f} vs plain loop "
              f"{loop['samples_per_s']:.0f} samples/s ({100 * (1 - single['samples_per_s'] / loop['samples_per_s']):+.1f}%); "
              f"CPU for the whole run: dtrain {single['cpu_s']:.2f} s vs loop {loop['cpu_s']:.2f} s "
              f"({100 * (single['cpu_s'] / loop['cpu_s'] - 1):+.1f}% overhead)")
PY

#!/usr/bin/env bash
# Training benchmark: samples/s on Fashion-MNIST for the zoo's CNN and MLP, in one run on this
# machine, side by side:
#   dtrain-grpc / dtrain-gloo   a dtrain job, 2 workers (one rank each), ddp, over each backend
#   torch-ddp-gloo              the same model in Python torch DistributedDataParallel + gloo
#   libtorch-loop               a plain single-process libtorch loop: the compute limit
# and dtrain's per-step overhead at world size 1 (single_device on one worker) against the
# plain loop with the same batch and threads.
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
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_TESTS=OFF \
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

# One dtrain job; its samples/s is the trainer's, from the first step to the last (after setup).
dtrain_job() {  # model backend strategy workers
  local model=$1 backend=$2 strategy=$3 workers=$4
  cat > "$work/job.yaml" <<JOB
name: bench-$model-$backend
model: {builtin: $model}
data: {builtin: fashion-mnist, batch_size: $batch, shuffle: false}
trainer: {max_steps: ${steps[$model]}, strategy: $strategy, num_workers: $workers,
          collective_backend: $backend, val_check_interval: 1000000000, skip_test: true, seed: 1}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
JOB
  local id
  id=$("$build/client/dtrain" submit --output json "$work/job.yaml" | sed -n 's/^ *"id": "\([^"]*\)".*/\1/p' | head -1)
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
  deploy/local/cluster.sh stop >&2

  echo "$model: torch DDP + gloo, 2 ranks ..." >&2
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  /usr/bin/python3 bench/torch_training.py --model "$model" --world_size 2 --batch "$batch" \
    --steps "${steps[$model]}" --threads $(( cores / 2 > 0 ? cores / 2 : 1 )) --port "$port" >> "$work/rows.jsonl"

  echo "$model: plain libtorch loop, global batch ..." >&2
  "$build/bench/dtrain-bench-train-loop" --model "$model" --batch $((2 * batch)) \
    --steps "${steps[$model]}" >> "$work/rows.jsonl"

  echo "$model: world size 1, dtrain vs the plain loop ..." >&2
  deploy/local/cluster.sh start --port 0 --workers 1 >&2
  export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
  dtrain_job "$model" grpc single_device 1 >> "$work/rows.jsonl"
  deploy/local/cluster.sh stop >&2
  "$build/bench/dtrain-bench-train-loop" --model "$model" --batch "$batch" \
    --steps "${steps[$model]}" | sed 's/"libtorch-loop"/"libtorch-loop-1"/' >> "$work/rows.jsonl"
done

if [ "$json" = 1 ]; then cat "$work/rows.jsonl"; exit 0; fi
/usr/bin/python3 - "$work/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["system"], r["model"]): r for r in rows}
print(f"{'model':6} {'system':16} {'ranks':>5} {'batch/rank':>10} {'samples/s':>10}  vs torch DDP")
for model in ("mlp", "cnn"):
    peer = by.get(("torch-ddp-gloo", model), {}).get("samples_per_s")
    for system in ("dtrain-grpc", "dtrain-gloo", "torch-ddp-gloo", "libtorch-loop"):
        r = by.get((system, model))
        if r is None:
            continue
        ratio = f"{r['samples_per_s'] / peer:.2f}x" if peer else ""
        batch = r["batch"] if system != "libtorch-loop" else f"{r['batch']} (1 rank)"
        print(f"{model:6} {system:16} {r['ranks']:>5} {batch:>10} {r['samples_per_s']:>10.0f}  {ratio}")
    single = by.get(("dtrain-single", model)); loop = by.get(("libtorch-loop-1", model))
    if single and loop:
        print(f"{model:6} world size 1: dtrain {single['samples_per_s']:.0f} vs plain loop "
              f"{loop['samples_per_s']:.0f} samples/s: {100 * (1 - single['samples_per_s'] / loop['samples_per_s']):.1f}% overhead")
PY

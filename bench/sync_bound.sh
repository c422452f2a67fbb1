#!/usr/bin/env bash
# How far below the compute ceiling any synchronous data-parallel run must stay on this
# machine, before a single byte is communicated: the ceiling of bench/training.sh (two plain
# loops started together, one per pinned core, 2 ranks' slices of each global batch) run with
# each step's duration recorded, and the two ranks' steps paired. Independent loops finish in
# max(sum of rank 0's steps, sum of rank 1's); ranks that wait for each other at every step
# (as ddp's gradient all-reduce makes them) take at least the sum over steps of the slower
# rank's step. Their ratio is the share of the ceiling a synchronous run keeps with a free,
# instant all-reduce: what rank skew alone costs. Pairing step i with step i assumes each
# rank's step times would be the same with a barrier between steps; the spread over the runs
# shows how steady that is.
#   bench/sync_bound.sh [--model mlp|cnn] [--runs N] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
model=mlp; runs=5; steps=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift ;;
    --runs) runs=$2; shift ;;
    --steps) steps=$2; shift ;;
    *) echo "usage: bench/sync_bound.sh [--model mlp|cnn] [--runs N] [--steps N]" >&2; exit 2 ;;
  esac
  shift
done
case "$model" in
  mlp) steps=${steps:-3000} ;;
  cnn) steps=${steps:-200} ;;
  *) echo "--model: '$model' is not mlp or cnn" >&2; exit 2 ;;
esac

deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-bench-train-loop >&2

batch=64
mapfile -t pins < <(deploy/local/cluster.sh cpus --workers 2)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for run in $(seq 1 "$runs"); do
  echo "run $run/$runs: the ceiling's two loops, $model, $steps steps, step times kept ..." >&2
  at=$(/usr/bin/python3 -c 'import time; print(f"{time.time() + 4:.3f}")')
  for i in 0 1; do
    "$build/bench/dtrain-bench-train-loop" --model "$model" --batch "$batch" --threads 1 \
      --warm_process 5 --warmup 0 --rank $i --world_size 2 --start_at "$at" --steps "$steps" \
      --step_times "$work/steps-$run-$i.txt" \
      ${pins[$i]:+--cpus="${pins[$i]}"} > "$work/row-$run-$i.json" &
  done
  wait
done

/usr/bin/python3 - "$work" "$runs" "$model" <<'EOF'
import json, statistics, sys
work, runs, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
shares, medians = [], []
for run in range(1, runs + 1):
    a, b = ([float(l) for l in open(f"{work}/steps-{run}-{i}.txt")] for i in (0, 1))
    rows = [json.load(open(f"{work}/row-{run}-{i}.json")) for i in (0, 1)]
    ceiling = sum(r["samples"] for r in rows) / (max(r["end"] for r in rows) -
                                                 min(r["start"] for r in rows))
    independent = max(sum(a), sum(b))
    synchronous = sum(max(x, y) for x, y in zip(a, b))
    share = independent / synchronous
    shares.append(share)
    medians.append((statistics.median(a), statistics.median(b)))
    print(f"run {run}: ceiling {ceiling:,.0f} samples/s; slower rank's steps summed "
          f"{synchronous / 1e3:,.1f} ms against {independent / 1e3:,.1f} ms apart: "
          f"a synchronous run keeps {share:.3f} of the ceiling")
print(json.dumps({"model": model, "runs": runs, "steps": len(a),
                  "synchronous_share_median": round(statistics.median(shares), 4),
                  "min": round(min(shares), 4), "max": round(max(shares), 4),
                  "median_step_us": [round(statistics.median(m[i] for m in medians), 1)
                                     for i in (0, 1)]}))
EOF

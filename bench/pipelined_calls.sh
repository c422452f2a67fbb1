#!/usr/bin/env bash
# Pipelined training calls against one call at a time (the job spec's trainer.pipelined_calls),
# side by side on one cluster: bench/bench-job.yaml's Fashion-MNIST job, at world size 1
# (single_device, one worker, one compute thread: where a call's round trip shows with nothing
# else around it) and with 2 workers (ddp on the default plane). Each round runs both settings
# back to back, the order alternating between rounds, on a cluster started for the round with
# one unmeasured warm-up job, so that a drifting core weighs on both alike. Prints, per model
# and world size, the medians of: training samples/s and each pair's ratio (pipelined over one
# at a time), which this VM's drifting step speed blurs by up to +-10% a job; and what pipelining
# is for, the workers' idle time between calls as a share of the training span (the job log's
# "between steps", with the busiest rank's time in steps, to 1 ms), with the busiest rank's
# time per batch in steps, which should not move.
#   bench/pipelined_calls.sh [--rounds N] [--models "mlp cnn"]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
rounds=5; models="mlp cnn"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift ;;
    --models) models=$2; shift ;;
    *) echo "usage: bench/pipelined_calls.sh [--rounds N] [--models \"mlp cnn\"]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain >&2

batch=64
# As bench/training.sh's: ~3 s of MLP steps, ~10 s of CNN ones, per job at world size 2.
declare -A steps=([mlp]=3000 [cnn]=200)
work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
cleanup() { deploy/local/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
source "$root/bench/bench_job.sh"
: > "$work/rows.jsonl"

job() {  # model workers pipelined round
  local model=$1 workers=$2 pipelined=$3 round=$4 strategy=ddp
  [ "$workers" = 1 ] && strategy=single_device
  local id
  id=$(bench_job_submit "$build" --name="pipelined-$pipelined" --model.builtin="$model" \
    --data.batch_size="$batch" --trainer.max_steps="${steps[$model]}" \
    --trainer.strategy="$strategy" --trainer.num_nodes="$workers" \
    --trainer.pipelined_calls="$pipelined")
  bench_job_wait "$build" "$id"
  "$build/client/dtrain" status "$id" --output json > "$work/status.json"
  "$build/client/dtrain" logs "$id" > "$work/log.txt"
  /usr/bin/python3 - "$work/status.json" "$work/log.txt" <<PY
import json, re, sys
s = json.load(open(sys.argv[1]))
if s['state'] != 'SUCCEEDED':
    sys.exit(f"$model, $workers worker(s), pipelined_calls $pipelined: the job ended {s['state']}")
p = s['progress']
log = open(sys.argv[2]).read()
# rank_timing.cc's line: "rank R S s in steps, ...; between steps (the coordinator) G s of T s"
gap = re.search(r"between steps \(the coordinator\) ([0-9.]+) s of ([0-9.]+) s", log)
in_steps = [float(x) for x in re.findall(r"rank \d+ ([0-9.]+) s in steps", log)]
if gap is None or not in_steps:
    sys.exit("$model, pipelined_calls $pipelined: no 'time by rank' line in the job log")
print(json.dumps({'model': '$model', 'workers': $workers, 'pipelined': '$pipelined' == 'true',
                  'round': $round,
                  'samples_per_s': p.get('train_samples_per_second') or p['samples_per_second'],
                  'gap_s': float(gap[1]), 'train_s': float(gap[2]),
                  'ms_per_batch': 1000 * max(in_steps) / ${steps[$model]}}))
PY
}

for model in $models; do
  for workers in 1 2; do
    for round in $(seq 1 "$rounds"); do
      echo "$model, $workers worker(s), round $round/$rounds ..." >&2
      if [ "$workers" = 1 ]; then
        deploy/local/cluster.sh start --port 0 --workers 1 --threads 1 >&2
      else
        deploy/local/cluster.sh start --port 0 --workers 2 >&2
      fi
      export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
      # Unmeasured: the worker's first steps (libraries, heap) would fall on one side only.
      steps_saved=${steps[$model]}; steps[$model]=20
      job "$model" "$workers" true 0 > /dev/null
      steps[$model]=$steps_saved
      if [ $(( round % 2 )) = 1 ]; then order="true false"; else order="false true"; fi
      for pipelined in $order; do job "$model" "$workers" "$pipelined" "$round"; done \
        >> "$work/rows.jsonl"
      deploy/local/cluster.sh stop >&2
    done
  done
done

/usr/bin/python3 - "$work/rows.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
print(f"{'model':6} {'world':>5} {'samples/s: pipelined':>20} {'one at a time':>13} {'ratio':>6} "
      f"{'gap: pipelined':>14} {'one at a time':>13} {'ms/batch ratio':>14}")
for model in dict.fromkeys(r["model"] for r in rows):
    for workers in (1, 2):
        pairs = {}
        for r in rows:
            if r["model"] == model and r["workers"] == workers:
                pairs.setdefault(r["round"], {})[r["pipelined"]] = r
        pairs = [p for p in pairs.values() if len(p) == 2]
        if not pairs:
            continue
        rate = lambda on: med(p[on]["samples_per_s"] for p in pairs)
        gap = lambda on: med(p[on]["gap_s"] / p[on]["train_s"] for p in pairs)
        print(f"{model:6} {workers:>5} {rate(True):>20.0f} {rate(False):>13.0f} "
              f"{med(p[True]['samples_per_s'] / p[False]['samples_per_s'] for p in pairs):>6.3f} "
              f"{100 * gap(True):>13.2f}% {100 * gap(False):>12.2f}% "
              f"{med(p[True]['ms_per_batch'] / p[False]['ms_per_batch'] for p in pairs):>14.3f}")
        print(f"{'':12} per round, samples/s ratio: "
              + " ".join(f"{p[True]['samples_per_s'] / p[False]['samples_per_s']:.3f}" for p in pairs))
PY

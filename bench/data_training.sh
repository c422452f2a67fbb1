#!/usr/bin/env bash
# Training from shards against training from memory (issue 36): the zoo's CNN on Fashion-MNIST
# (Debian's dataset-fashion-mnist) on a local cluster of a coordinator and 2 workers, ddp,
#   (m) data.builtin fashion-mnist: the IDX files loaded into memory on every rank;
#   (s) the same images as PNG WebDataset shards (written once with dtrain.data.write_shards,
#       PIL 'L' images and int labels), streamed, PNG-decoded and normalized on data.num_workers
#       threads per rank (by the reader itself where a rank has one core, as here);
# same seed, batch and steps, in alternating order ((m, s) in odd runs, (s, m) in even ones),
# after one short untimed job of each kind (a warm-up). Prints each job's training samples/s
# (its samples over the status's train phase seconds) and its whole-job samples/s (the status's
# samples_per_second: first step to end, test included), its data wait (the job log's "time by
# rank" line), its test accuracy, the median ratio s/m of the training rate (target >= 0.95),
# and each run's own ratio.
#   bench/data_training.sh [--runs N] [--steps N] [--num_workers N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
runs=1
steps=600
num_workers=2
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --num_workers) num_workers="$2"; shift ;;
    *) echo "usage: bench/data_training.sh [--runs N] [--steps N] [--num_workers N]" >&2; exit 2 ;;
  esac
  shift
done

build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain dtrain_python >&2

# The shards, once: the builtin's training split (the first 55,000 images; it holds the last
# 5,000 out for validation) and the 10,000 test images, in shards of 2,000.
data="${DTRAIN_BENCH_DATA:-/tmp/dtrain-bench-data}/fashion-png-55k"
if [ ! -e "$data/done" ]; then
  echo "writing Fashion-MNIST as PNG shards to $data (once) ..." >&2
  mkdir -p "$data"
  PYTHONPATH="$build/python" /usr/bin/python3 - "$data" <<'PY'
import gzip, sys
import numpy as np
from PIL import Image
from dtrain.data import write_shards

src = "/usr/share/datasets/fashion-mnist"

def idx(name, offset):
    with gzip.open(f"{src}/{name}", "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)

class Fashion:
    def __init__(self, split):
        self.x = idx(f"{split}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
        self.y = idx(f"{split}-labels-idx1-ubyte.gz", 8)
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return Image.fromarray(self.x[i], "L"), int(self.y[i])

for split, prefix, limit in (("train", "train", 55000), ("t10k", "test", None)):
    write_shards(Fashion(split), sys.argv[1], samples_per_shard=2000, prefix=prefix,
                 image_format="png", fields=["png", "cls"], limit=limit, overwrite=True)
PY
  touch "$data/done"
fi

work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
deploy/local/cluster.sh start --port 0 --http_port 0 --workers 2 >&2
trap 'deploy/local/cluster.sh stop >&2; rm -rf "$work"' EXIT
export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
cli="$build/client/dtrain"

common="trainer: {max_steps: $steps, strategy: ddp, precision: 32-true, accelerator: cpu,
          devices: 1, num_nodes: 2, val_check_interval: 1000000000}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, nesterov: true}"
cat > "$work/memory.yaml" <<JOB
name: fashion-memory
model: {builtin: cnn}
data: {builtin: fashion-mnist, batch_size: 32}
$common
JOB
norm="[{normalize: {mean: [0.2860], std: [0.3530]}}]"
cat > "$work/shards.yaml" <<JOB
name: fashion-shards
model: {builtin: cnn}
data:
  batch_size: 32
  num_workers: $num_workers
  shards:
    train: worker:$data/train.txt
    test: worker:$data/test.txt
    fields: [{name: png, type: image, image_mode: L}, {name: cls, type: int}]
  transforms: {train: $norm, eval: $norm}
$common
JOB

rows="$work/rows.jsonl"
job() {  # kind run
  local id
  id=$("$cli" fit --output json --config "$work/$1.yaml" |
       sed -n 's/^ *"id": "\([^"]*\)".*/\1/p' | head -1)
  "$cli" watch "$id" >/dev/null
  "$cli" status "$id" --output json > "$work/status.json"
  "$cli" results "$id" --output json > "$work/results.json"
  "$cli" logs "$id" > "$work/log.txt" 2>&1 || true
  /usr/bin/python3 - "$1" "$2" "$work" "$steps" <<'PY' | tee -a "$rows"
import json, re, sys
kind, run, work, steps = sys.argv[1:5]
s = json.load(open(f"{work}/status.json"))
state = s.get("state", "")
if "SUCCEEDED" not in json.dumps(state):
    sys.exit(f"job {kind} run {run} ended {state}: {s}")
res = json.dumps(json.load(open(f"{work}/results.json")))
acc = re.search(r'"test_acc": ([0-9.]+)', res)
timing = [l.strip() for l in open(f"{work}/log.txt") if "time by rank" in l]
train_s = s["progress"]["phase_seconds"]["train"]
samples = int(steps) * 32 * 2
print(json.dumps({"kind": kind, "run": int(run),
                  "train_samples_per_s": round(samples / train_s, 1), "train_s": round(train_s, 2),
                  "samples_per_s": round(s["progress"]["samples_per_second"], 1),
                  "test_acc": float(acc.group(1)) if acc else None,
                  "time_by_rank": timing[-1] if timing else ""}))
PY
}
# A first job on freshly started workers trained at a fraction of the later jobs' rate (806,
# 1,582 and 2,433 samples/s in three runs of 2026-11-29, against 3,300-4,600 for the later
# jobs), and the first job was always the in-memory one: each kind runs once untimed first.
echo "warm-up (not counted) ..." >&2
for kind in memory shards; do
  sed "s/max_steps: $steps,/max_steps: 100,/" "$work/$kind.yaml" > "$work/warm-$kind.yaml"
  grep -q "max_steps: 100," "$work/warm-$kind.yaml" || { echo "warm-up spec not made" >&2; exit 1; }
  job "warm-$kind" 0 >/dev/null
done
: > "$rows"
# The order alternates too: memory first in odd runs, shards first in even ones.
for run in $(seq "$runs"); do
  echo "run $run/$runs ..." >&2
  if [ $((run % 2)) -eq 1 ]; then
    job memory "$run"
    job shards "$run"
  else
    job shards "$run"
    job memory "$run"
  fi
done

/usr/bin/python3 - "$rows" "$runs" "$steps" "$num_workers" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs, steps, nw = sys.argv[2:5]
med = lambda k, f: statistics.median(r[f] for r in rows if r["kind"] == k)
m, s = med("memory", "train_samples_per_s"), med("shards", "train_samples_per_s")
mj, sj = med("memory", "samples_per_s"), med("shards", "samples_per_s")
print(f"CNN, Fashion-MNIST, 2 ranks x batch 32, {steps} steps, data.num_workers {nw}, "
      f"median of {runs} run(s)")
print(f"{'data':<40}{'train samples/s':>16}{'job samples/s':>14}{'test acc':>10}")
for kind, label, a, b in (("memory", "in memory (data.builtin fashion-mnist)", m, mj),
                          ("shards", "PNG shards (data.shards, streamed)", s, sj)):
    print(f"{label:<40}{a:>16.0f}{b:>14.0f}{med(kind, 'test_acc'):>10.4f}")
by_run = {(r["kind"], r["run"]): r["train_samples_per_s"] for r in rows}
runs_seen = sorted({r["run"] for r in rows})
pairs = [by_run[("shards", n)] / by_run[("memory", n)] for n in runs_seen
         if ("memory", n) in by_run and ("shards", n) in by_run]
print(f"shards / in memory, training rate: {s / m:.3f}  (target >= 0.95); "
      f"whole job: {sj / mj:.3f}")
print(f"per run (shards / memory of the same run): "
      f"{', '.join(f'{p:.3f}' for p in pairs)}; median {statistics.median(pairs):.3f}")
PY

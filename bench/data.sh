#!/usr/bin/env bash
# Image input pipeline benchmark (issue 36): a synthetic ImageNet-like set (20,000 JPEGs of
# 200-320 px, 100 classes) built once under ${DTRAIN_BENCH_DATA:-/tmp/dtrain-bench-data}, as an
# ImageFolder and as WebDataset shards of the same bytes, then in one run on the same cores
# (2 threads / 2 DataLoader workers each):
#   (a) libjpeg-turbo's decode alone (tjDecompress2) of the shards' JPEGs, in memory: the ceiling;
#   (b) dtrain's pipeline: TarShardReader + decode + RandomResizedCrop(224) + RandomHorizontalFlip
#       + ToTensor + Normalize (worker/data/image_transforms.h);
#   (c) torchvision: ImageFolder + DataLoader(num_workers=2, batch_size=64) with the same
#       transforms on PIL images, as users write it.
# Prints samples/s of each (the median of --runs) and the ratios b/c and b/a (each run's, then
# the median). Each run measures every system --passes times (default 4), one pass after the
# other, and each system keeps its best pass (as bench/training.sh does): this VM only ever
# slows a measurement, for seconds at a time, and with one pass the runs' b/a on one machine
# type spread from 0.785 to 1.174 (docs/BENCHMARKS.md, "Image input pipeline"). A pass of
# dtrain's rows lasts ~4 s a row, no longer than a slow phase: on the family-25 machine a 3-run
# table of 2 passes gave a median b/a of 0.841, one of 4 passes 0.902. dtrain's and torchvision's
# rows are their steady state: from the end of the third batch, not counting what was
# prefetched then; the rows "whole epoch" include each one's start (shuffle buffer fill, worker
# processes, first touch of memory).
#   bench/data.sh [--quick] [--runs N] [--passes N] [--threads N]
# --quick: 2,000 images (its own cached set).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
count=20000
runs=1
passes=4
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) count=2000 ;;
    --runs) runs="$2"; shift ;;
    --passes) passes="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    *) echo "usage: bench/data.sh [--quick] [--runs N] [--passes N] [--threads N]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh --bench >&2
# The ceiling's decoder (TurboJPEG's API of the same libjpeg-turbo).
dpkg-query -W -f='${Status}' libturbojpeg0-dev 2>/dev/null | grep -q "install ok installed" || {
  echo "bench/data.sh needs libturbojpeg0-dev (apt-get install libturbojpeg0-dev)" >&2; exit 1; }
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-bench-data-pipeline >&2

data="${DTRAIN_BENCH_DATA:-/tmp/dtrain-bench-data}"
[ "$count" = 2000 ] && data="$data-quick"
if [ ! -e "$data/done-$count" ]; then
  echo "writing $count synthetic JPEGs to $data (once) ..." >&2
  /usr/bin/python3 bench/data_make_images.py "$data" "$count"
fi

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# Each row labelled with its run and pass.
label() {  # run pass
  /usr/bin/python3 -c "import json,sys
for l in sys.stdin:
    if l.strip(): print(json.dumps({**json.loads(l), 'run': $1, 'pass': $2}))"
}
for run in $(seq "$runs"); do
  for pass in $(seq "$passes"); do
    echo "run $run/$runs, pass $pass/$passes ..." >&2
    "$build/bench/dtrain-bench-data-pipeline" --shards="$data/shards" --threads="$threads" |
      label "$run" "$pass" >> "$rows"
    /usr/bin/python3 bench/data_torchvision.py "$data/imagefolder" --workers "$threads" |
      label "$run" "$pass" >> "$rows"
  done
done

python3 - "$rows" "$count" "$runs" "$threads" "$(nproc)" "$passes" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
count, runs, threads, cores, passes = sys.argv[2:7]
# Per run and system, the best pass; then each system's runs in run order.
best = {}
for r in rows:
    key = (r["system"], r["run"])
    best[key] = max(best.get(key, 0), r["samples_per_s"])
by = {}
for (system, run), v in sorted(best.items(), key=lambda kv: kv[0][1]):
    by.setdefault(system, []).append(v)
rate = {k: statistics.median(v) for k, v in by.items()}
print(f"{count} JPEGs, {threads} threads/workers on {cores} cores, median of {runs} run(s), "
      f"each system's best of {passes} pass(es) a run")
a = rate["libjpeg-turbo decode (ceiling)"]
print(f"{'pipeline':<80}{'samples/s':>11}{'of ceiling':>12}")
for k, v in rate.items():
    print(f"{k:<80}{v:>11.0f}{v / a:>12.2f}")
if "dtrain pipeline" not in by or not any(k.startswith("torchvision") and "whole" not in k
                                          for k in by):
    sys.exit("no steady-state rows: the epoch is too short (use the full set, not --quick)")
if len(by["dtrain pipeline"]) != len(by["libjpeg-turbo decode (ceiling)"]):
    sys.exit("a run printed no steady-state row: its ratios cannot be paired")
torchvision = next(k for k in by if k.startswith("torchvision") and "whole" not in k)
# Each run's own ratio, then the median: the machine's speed moves between runs.
per_run = [p / q for p, q in zip(by["dtrain pipeline"], by["libjpeg-turbo decode (ceiling)"])]
whole = [p / q for p, q in zip(by["dtrain pipeline, whole epoch (start included)"],
                               by["libjpeg-turbo decode (ceiling)"])]
versus = [p / q for p, q in zip(by["dtrain pipeline"], by[torchvision])]
print(f"b/c (dtrain / torchvision):    {statistics.median(versus):.2f}  (target >= 2)")
print(f"b/a (dtrain / decode ceiling): {statistics.median(per_run):.3f}  (target >= 0.85; "
      f"runs {', '.join(f'{r:.3f}' for r in per_run)})")
print(f"b/a over whole epochs:         {statistics.median(whole):.3f}  (runs "
      f"{', '.join(f'{r:.3f}' for r in whole)})")
PY

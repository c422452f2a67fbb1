#!/bin/bash
# An A/B of two dtrain builds, or of two sets of job options, on bench/training.sh's ddp job:
# two local clusters pinned to the same cores, each warmed by a short job, then jobs taking
# turns (A B, B A, A B, ...) so that the machine's drift, several percent a minute on a shared
# VM, falls on both sides alike. Each job gives its rate and, from its log, each rank's mean batch
# by phase. The summary pairs the jobs: B/A rate (median, geometric mean, quartiles, range, and
# the median by which side ran first) and B-A per phase (median, quartiles, pairs below / equal
# to / above zero). A change of half a percent shows in its phase long before it shows in a rate;
# the same build on both sides (an A/A run) gives the noise floor. --pairs must be even.
# Each side's jobs run beside the other side's idle cluster (heartbeats, idle threads): a build
# that costs more while idle would show on the opposite side, which an A/A run cannot reveal.
# On a failure the work directory (rows, the clusters' logs) is kept.
#   bench/ab_jobs.sh [--a BUILD_DIR] [--b BUILD_DIR] [--a-option OVERRIDE]...
#                    [--b-option OVERRIDE]... [--model cnn|mlp] [--pairs N] [--steps N]
#                    [--rows FILE]
# BUILD_DIR defaults to build/ and must hold dtrain-coordinator, dtrain-worker and dtrain. For a
# change against its parent:
#   git worktree add /tmp/ab-base HEAD~1 && cmake -S /tmp/ab-base -B /tmp/ab-base/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release -DDTRAIN_BUILD_WORKER=ON && cmake --build /tmp/ab-base/build \
#     --target dtrain-coordinator dtrain-worker dtrain
#   bench/ab_jobs.sh --a /tmp/ab-base/build --b build --model cnn --pairs 12
# An OVERRIDE is one `dtrain fit` override, e.g. --b-option=--trainer.collective_backend=gloo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: bench/ab_jobs.sh [--a BUILD_DIR] [--b BUILD_DIR] [--a-option OVERRIDE]... \
[--b-option OVERRIDE]... [--model cnn|mlp] [--pairs N] [--steps N] [--rows FILE]"
declare -A dir=([a]="$root/build" [b]="$root/build")
a_options=(); b_options=()
model=cnn; pairs=12; steps=""; keep_rows=""
# Paths are the caller's (relative to where the script was started), so parsed before the cd.
while [ $# -gt 0 ]; do
  case "$1" in
    --a-option=*) a_options+=("${1#--a-option=}"); shift; continue ;;
    --b-option=*) b_options+=("${1#--b-option=}"); shift; continue ;;
    --a=*|--b=*|--model=*|--pairs=*|--steps=*|--rows=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
  esac
  case "$1" in
    --a|--b|--a-option|--b-option|--model|--pairs|--steps|--rows)
      [ $# -ge 2 ] || { echo "ab_jobs.sh: $1 needs a value; $usage" >&2; exit 2; } ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  case "$1" in
    --a|--b) dir[${1#--}]=$(realpath -- "$2") ;;
    --a-option) a_options+=("$2") ;;
    --b-option) b_options+=("$2") ;;
    --model) model=$2 ;;
    --pairs) pairs=$2 ;;
    --steps) steps=$2 ;;
    --rows) keep_rows=$(realpath -- "$2") ;;
  esac
  shift 2
done
cd "$root"
case "$model" in cnn|mlp) ;; *) echo "ab_jobs.sh: --model is cnn or mlp" >&2; exit 2 ;; esac
declare -A default_steps=([mlp]=3000 [cnn]=200)   # bench/training.sh's
steps=${steps:-${default_steps[$model]}}
for n in "$pairs" "$steps"; do
  case "$n" in ''|*[!0-9]*|0) echo "ab_jobs.sh: --pairs and --steps take a whole number >= 1" >&2
                              exit 2 ;; esac
done
# Each side goes first in half the pairs.
(( pairs % 2 == 0 )) || { echo "ab_jobs.sh: --pairs must be even (got $pairs)" >&2; exit 2; }
for side in a b; do
  for binary in coordinator/dtrain-coordinator worker/dtrain-worker client/dtrain; do
    [ -x "${dir[$side]}/$binary" ] ||
      { echo "ab_jobs.sh: ${dir[$side]}/$binary is missing (build it first)" >&2; exit 1; }
  done
done

work=$(mktemp -d)
cleanup() {
  local code=$?
  for side in a b; do
    DTRAIN_LOCAL_DIR="$work/$side" deploy/local/cluster.sh stop >/dev/null 2>&1 || true
  done
  if [ "$code" = 0 ]; then
    rm -rf "$work"
  else
    echo "ab_jobs.sh: failed; rows and the clusters' logs are in $work" >&2
  fi
}
trap cleanup EXIT
if [ -n "$keep_rows" ]; then : > "$keep_rows"; fi
source "$root/bench/bench_job.sh"
declare -A address
for side in a b; do
  DTRAIN_BIN_DIR="${dir[$side]}" DTRAIN_LOCAL_DIR="$work/$side" \
    deploy/local/cluster.sh start --port 0 --workers 2 >&2
  address[$side]="127.0.0.1:$(cat "$work/$side/port")"
done

# One job on a side's cluster; prints {side, samples_per_s, ranks: per rank [batch, data,
# forward, backward, averaging, optimizer, other] in ms}.
job() {  # side steps
  local side=$1 build=${dir[$1]} id options
  if [ "$side" = a ]; then options=("${a_options[@]}"); else options=("${b_options[@]}"); fi
  export DTRAIN_COORDINATOR=${address[$side]}
  id=$(bench_job_submit "$build" --name="ab-$model-$side" --model.builtin="$model" \
       --data.batch_size=64 --trainer.max_steps="$2" --trainer.strategy=ddp \
       --trainer.num_nodes=2 "${options[@]}")
  bench_job_wait "$build" "$id"
  bench_job_result "$build" "$id" "ab_jobs.sh: side $side's job" | /usr/bin/python3 -c "
import json, sys
r = json.load(sys.stdin)
ranks = [[b, *p, o] for b, p, o in zip(r['batch_ms'], r['phases_ms'], r['other_ms'])]
print(json.dumps({'side': '$side', 'samples_per_s': r['samples_per_s'], 'ranks': ranks}))"
}

job a 20 > /dev/null; job b 20 > /dev/null   # the warm jobs, as training.sh's
: > "$work/rows.jsonl"
for i in $(seq 1 "$pairs"); do
  if (( i % 2 )); then order="a b"; else order="b a"; fi
  for side in $order; do
    job "$side" "$steps" >> "$work/rows.jsonl"
    if [ -n "$keep_rows" ]; then tail -1 "$work/rows.jsonl" >> "$keep_rows"; fi
  done
  echo "pair $i/$pairs: $(tail -2 "$work/rows.jsonl" | /usr/bin/python3 -c "
import json, sys
rows = map(json.loads, sys.stdin)
print(', '.join(f\"{r['side']} {r['samples_per_s']:.0f}\" for r in rows))")" >&2
done

echo "A: ${dir[a]} ${a_options[*]}"
echo "B: ${dir[b]} ${b_options[*]}"
/usr/bin/python3 - "$work/rows.jsonl" "$model" "$steps" <<'EOF'
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# Consecutive rows are a pair; the first of the two ran first.
pairs = [{'first': rows[i]['side'], **{r['side']: r for r in rows[i:i + 2]}}
         for i in range(0, len(rows) - 1, 2)]
print(f'{len(pairs)} pairs of {sys.argv[2]} jobs, {sys.argv[3]} steps each, the order flipped '
      'every pair')

def quartiles(v):
    if len(v) < 2:
        return v[0], v[0]
    q = statistics.quantiles(v, n=4, method='inclusive')
    return q[0], q[2]

def signs(v):  # below, equal to, above zero (the log gives ms to 0.001: ties happen)
    return sum(x < 0 for x in v), sum(x == 0 for x in v), sum(x > 0 for x in v)

def ratio(p):
    return p['b']['samples_per_s'] / p['a']['samples_per_s']

ratios = [ratio(p) for p in pairs]
print(f"rate, samples/s: A median {statistics.median(p['a']['samples_per_s'] for p in pairs):.0f}, "
      f"B median {statistics.median(p['b']['samples_per_s'] for p in pairs):.0f}")
q1, q3 = quartiles(ratios)
print(f'B/A rate: median {statistics.median(ratios):.3f}, geometric mean '
      f'{math.exp(statistics.mean(map(math.log, ratios))):.3f}, quartiles {q1:.3f}-{q3:.3f}, '
      f'range {min(ratios):.3f}-{max(ratios):.3f}, above 1 in {sum(r > 1 for r in ratios)} of '
      f'{len(ratios)}')
# Whichever side runs second might gain (a warmer machine) or lose (a hotter one).
by_order = {f: [ratio(p) for p in pairs if p['first'] == f] for f in ('a', 'b')}
print('B/A rate by which ran first: ' + ', '.join(
    f'{f.upper()} first {statistics.median(v):.3f} ({len(v)} pairs)'
    for f, v in by_order.items() if v))
names = ['batch', 'data', 'forward', 'backward', 'averaging', 'optimizer', 'other']
usable = [p for p in pairs if p['a']['ranks'] and len(p['a']['ranks']) == len(p['b']['ranks'])]
if not usable:
    print('no pair has both jobs\' phases (is "time per batch by rank" in the job logs?)')
    sys.exit(0)
def mean_of_ranks(job, k):
    return sum(r[k] for r in job['ranks']) / len(job['ranks'])
print(f'ms a batch, mean of the ranks (B-A: median of {len(usable)} pairs, quartiles, pairs '
      'below / equal to / above 0):')
for k, name in enumerate(names):
    a = statistics.median(mean_of_ranks(p['a'], k) for p in usable)
    d = [mean_of_ranks(p['b'], k) - mean_of_ranks(p['a'], k) for p in usable]
    q1, q3 = quartiles(d)
    below, equal, above = signs(d)
    print(f'  {name:>10}: A {a:7.3f}, B-A {statistics.median(d):+.3f} ({q1:+.3f} to {q3:+.3f}), '
          f'{below} / {equal} / {above}')
EOF

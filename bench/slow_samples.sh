#!/bin/bash
# Where a slow dtrain sample loses its time. bench/training.sh's pass for one model, repeated
# PASSES times: the compute ceiling and the lockstep loops (bench/ceiling.sh), a fresh local
# cluster running a warm 20-step job then auto, gloo, grpc and auto jobs, the ceiling and the
# loops again, one torch DDP sample on the worker's allocator. Every dtrain-auto job keeps each
# rank's mean batch by phase from its log and the vCPUs' steal ticks over its span (the
# hypervisor's own account of time it took the cores away).
#   bench/slow_samples.sh [--passes N] [--model cnn|mlp] [--rows FILE]
# Prints a line per pass, then dtrain-auto and the lockstep loops each against the ceiling
# sample next to them (the pass's first for the first job and loops, its second for the second)
# and against the pass's better ceiling sample, with the counts below 0.8; the dtrain-auto jobs
# fastest first with both ranks' phases; dtrain-auto against torch; and each dtrain-auto job's
# batch against the lockstep loops' next to it, phase by phase.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
passes=20; model=cnn; keep_rows=""
while [ $# -gt 0 ]; do
  case "$1" in
    --passes) passes=$2; shift ;;
    --model) model=$2; shift ;;
    --rows) keep_rows=$2; shift ;;
    *) echo "usage: bench/slow_samples.sh [--passes N] [--model cnn|mlp] [--rows FILE]" >&2
       exit 2 ;;
  esac
  shift
done
case "$model" in cnn|mlp) ;; *) echo "slow_samples.sh: --model is cnn or mlp" >&2; exit 2 ;; esac

deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain dtrain-bench-train-loop >&2

batch=64
declare -A default_steps=([mlp]=3000 [cnn]=200)   # bench/training.sh's
steps=${default_steps[$model]}
mapfile -t pins < <(deploy/local/cluster.sh cpus --workers 2)
work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
cleanup() { deploy/local/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
source "$root/bench/ceiling.sh"
source "$root/bench/bench_job.sh"
allocator_env_text=$("$build/bench/dtrain-bench-train-loop" --print_allocator_env)
mapfile -t worker_allocator_env <<< "$allocator_env_text"
[ -n "$allocator_env_text" ] ||
  { echo "slow_samples.sh: no allocator environment from dtrain-bench-train-loop" >&2; exit 1; }

rate() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read())['samples_per_s'])"; }
steal_ticks() { awk '/^cpu[0-9]+ /{s += $9} END {print s + 0}' /proc/stat; }

# One job of the pass; prints {backend, samples_per_s, phases_ms (per rank: data, forward,
# backward, averaging, optimizer), other_ms (per rank: its time in steps a batch outside the
# phases), between_s (the coordinator's time between calls), steal_ticks}.
job() {  # backend max_steps
  local overrides=(--name="slow-samples-$model-$1" --model.builtin="$model"
                   --data.batch_size="$batch" --trainer.max_steps="$2"
                   --trainer.strategy=ddp --trainer.num_nodes=2) id s0 s1
  if [ "$1" != auto ]; then overrides+=(--trainer.collective_backend="$1"); fi
  id=$(bench_job_submit "$build" "${overrides[@]}")
  s0=$(steal_ticks)
  bench_job_wait "$build" "$id"
  s1=$(steal_ticks)
  bench_job_result "$build" "$id" "slow_samples: the $1 job" | /usr/bin/python3 -c "
import json, sys
r = json.load(sys.stdin)
print(json.dumps({'backend': '$1', 'samples_per_s': r['samples_per_s'],
                  'phases_ms': r['phases_ms'], 'other_ms': r['other_ms'],
                  'between_s': r['between_s'], 'steal_ticks': $s1 - $s0}))"
}

: > "$work/passes.jsonl"
for pass in $(seq 1 "$passes"); do
  echo "pass $pass/$passes ..." >&2
  c1=$(ceiling_once "$build" "$work" "$model" "$batch" "$steps" "$pass" | rate)
  l1_row=$(lockstep_once "$build" "$work" "$model" "$batch" "$steps" "$pass")
  deploy/local/cluster.sh start --port 0 --workers 2 >&2
  export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
  job auto 20 > /dev/null   # the warm job, as training.sh's
  jobs=()
  for backend in auto gloo grpc auto; do jobs+=("$(job "$backend" "$steps")"); done
  deploy/local/cluster.sh stop >&2
  c2=$(ceiling_once "$build" "$work" "$model" "$batch" "$steps" "$pass" | rate)
  l2_row=$(lockstep_once "$build" "$work" "$model" "$batch" "$steps" "$pass")
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  torch=$( (export "${worker_allocator_env[@]}"
            /usr/bin/python3 bench/torch_training.py --model "$model" --world_size 2 \
              --batch "$batch" --steps "$steps" --threads 1 --port "$port" \
              ${pins[1]:+--cpus "${pins[@]}"}) | rate)
  /usr/bin/python3 -c "
import json, sys
loops = [json.loads(l) for l in sys.argv[1:3]]
print(json.dumps({'pass': $pass, 'ceiling': [$c1, $c2],
                  'lockstep': [l['samples_per_s'] for l in loops],
                  'lockstep_phases_ms': [l.get('phases_ms') for l in loops],
                  'jobs': [json.loads(j) for j in sys.argv[3:]], 'torch_jemalloc': $torch}))" \
    "$l1_row" "$l2_row" "${jobs[@]}" | tee -a "$work/passes.jsonl" | /usr/bin/python3 -c "
import json, sys
r = json.load(sys.stdin)
print(f\"pass {r['pass']}: ceiling {r['ceiling'][0]:.0f}, lockstep {r['lockstep'][0]:.0f} | jobs \"
      + ' '.join(f\"{j['backend']} {j['samples_per_s']:.0f}\" for j in r['jobs'])
      + f\" | ceiling {r['ceiling'][1]:.0f}, lockstep {r['lockstep'][1]:.0f} | \"
      f\"torch-jemalloc {r['torch_jemalloc']:.0f}\")"
done
if [ -n "$keep_rows" ]; then cp "$work/passes.jsonl" "$keep_rows"; fi

/usr/bin/python3 - "$work/passes.jsonl" "$batch" "$steps" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
batch, steps = int(sys.argv[2]), int(sys.argv[3])

def quartiles(values):
    v = sorted(values)
    return v[len(v) // 4], v[(3 * len(v)) // 4]

def spread(name, values):
    v = sorted(values)
    q1, q3 = quartiles(v)
    print(f'{name}: median {statistics.median(v):.3f} (quartiles {q1:.3f}-{q3:.3f}, range '
          f'{v[0]:.3f}-{v[-1]:.3f}), below 0.8 in {sum(x < 0.8 for x in v)} of {len(v)}')

auto = [[j for j in r['jobs'] if j['backend'] == 'auto'] for r in rows]
spread('dtrain-auto / the ceiling sample next to it',
       [a[i]['samples_per_s'] / r['ceiling'][i] for r, a in zip(rows, auto) for i in (0, 1)])
spread('lockstep loops / the ceiling sample next to them',
       [r['lockstep'][i] / r['ceiling'][i] for r in rows for i in (0, 1)])
spread("dtrain-auto / the pass's better ceiling sample",
       [j['samples_per_s'] / max(r['ceiling']) for r, a in zip(rows, auto) for j in a])
spread("lockstep loops / the pass's better ceiling sample",
       [l / max(r['ceiling']) for r in rows for l in r['lockstep']])
spread("dtrain-auto's better job / the lockstep loops' better sample",
       [max(j['samples_per_s'] for j in a) / max(r['lockstep']) for r, a in zip(rows, auto)])
spread("dtrain-auto's better job / torch DDP on the worker's allocator",
       [max(j['samples_per_s'] for j in a) / r['torch_jemalloc'] for r, a in zip(rows, auto)])
print('dtrain-auto jobs, fastest first (ms a batch per rank: forward, backward, averaging):')
jobs = [(r['pass'], j) for r, a in zip(rows, auto) for j in a if len(j['phases_ms']) == 2]
for p, j in sorted(jobs, key=lambda t: -t[1]['samples_per_s']):
    r0, r1 = j['phases_ms']
    skew = max(r0[1], r1[1]) / min(r0[1], r1[1]) - 1
    print(f"  pass {p:2d}: {j['samples_per_s']:7.0f} samples/s; forward {r0[1]:.2f}/{r1[1]:.2f}, "
          f"backward {r0[2]:.2f}/{r1[2]:.2f}, averaging {r0[3]:.2f}/{r1[3]:.2f}; forward skew "
          f"{skew:.3f}; steal {j['steal_ticks']} ticks")

# Each dtrain-auto job against the lockstep loops next to it, ms a batch (both ranks' mean):
# the phases both time, the job's time in steps outside them, the coordinator's between calls,
# and what is left of the wall-clock difference (the calls' transport and the workers' own
# work around a call).
names = ['data', 'forward', 'backward', 'averaging', 'optimizer']
deltas = {k: [] for k in names + ['in steps, other', 'between calls', 'the rest', 'batch']}
loop_batch = []
for r, a in zip(rows, auto):
    for i, j in enumerate(a[:2]):
        lp = (r.get('lockstep_phases_ms') or [None, None])[i]
        if len(j['phases_ms']) != 2 or not lp or None in lp or j['between_s'] is None:
            continue
        job_wall = 1000 * 2 * batch / j['samples_per_s']
        loop_wall = 1000 * 2 * batch / r['lockstep'][i]
        loop_batch.append(loop_wall)
        explained = 0.0
        for k, name in enumerate(names):
            d = (sum(x[k] for x in j['phases_ms']) - sum(x[k] for x in lp)) / 2
            deltas[name].append(d)
            explained += d
        other = sum(j['other_ms']) / 2
        between = 1000 * j['between_s'] / steps
        deltas['in steps, other'].append(other)
        deltas['between calls'].append(between)
        deltas['the rest'].append(job_wall - loop_wall - explained - other - between)
        deltas['batch'].append(job_wall - loop_wall)
if loop_batch:
    m = statistics.median(loop_batch)
    print(f'dtrain-auto against the lockstep loops next to it, ms a batch (median of '
          f'{len(loop_batch)} pairs; the loops: {m:.3f} ms a batch):')
    for name, v in deltas.items():
        d, (q1, q3) = statistics.median(v), quartiles(v)
        print(f'  {name:>16}: {d:+.3f} ms ({100 * d / m:+.1f}% of the loops\' batch; '
              f'quartiles {q1:+.3f} to {q3:+.3f})')
EOF

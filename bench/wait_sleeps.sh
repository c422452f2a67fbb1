#!/bin/bash
# How often a job's ranks sleep at the shm plane's barriers, and what those sleeps cost a step.
# A rank polls for its peers up to 1 ms, then sleeps on a futex; a sleep ends in a wake-up that a
# poll would not pay. This starts a local cluster (deploy/local/cluster.sh, 2 workers of one
# compute thread, each pinned to a core of its own), runs bench/training.sh's ddp job of the
# model, and over a window in the middle of training counts each step thread's voluntary context
# switches (/proc/<pid>/task/<tid>/status) against the optimizer steps the job made. A step
# thread also blocks between training calls (about 4 a second), so the count is an upper bound
# of the barrier sleeps. In the same run, build/bench/dtrain-bench-wake-latency measures a futex
# wake-up's extra latency over a poll's on the workers' two cores. Sleeps a step times the mean
# extra is the sleeps' cost a step, printed beside the job's own step time from the same run.
#   bench/wait_sleeps.sh [--model cnn|mlp] [--steps N] [--window S] [--build DIR]
# Defaults: cnn, 1500 steps (mlp: 40000), a 10 s window after 5 s of training, build/.
# The workers run their ranks in their own processes: $DTRAIN_WORKER_FLAGS must not ask for
# --rank_isolation=process (thread_cpu.py finds a child's step thread, but the counts here were
# only ever checked against ranks in the daemons).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=cnn; steps=""; window=10; build=$root/build
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "wait_sleeps.sh: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --model) model=$2 ;;
    --steps) steps=$2 ;;
    --window) window=$2 ;;
    --build) build=$(realpath -- "$2") ;;
    *) echo "usage: bench/wait_sleeps.sh [--model cnn|mlp] [--steps N] [--window S] [--build DIR]" >&2
       exit 2 ;;
  esac
  shift 2
done
case "$model" in cnn) steps=${steps:-1500} ;; mlp) steps=${steps:-40000} ;;
  *) echo "wait_sleeps.sh: --model is cnn or mlp" >&2; exit 2 ;; esac
cd "$root"
case " ${DTRAIN_WORKER_FLAGS:-} " in *rank_isolation=process*)
  echo "wait_sleeps.sh: counts the workers' own step threads; unset --rank_isolation=process" >&2
  exit 2 ;;
esac
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain dtrain-bench-wake-latency \
  >/dev/null
source "$root/bench/bench_job.sh"
work=$(mktemp -d)
cleanup() {
  DTRAIN_LOCAL_DIR="$work" deploy/local/cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mapfile -t cores < <(DTRAIN_LOCAL_DIR="$work" deploy/local/cluster.sh cpus --workers 2 --threads 1)
[ "${#cores[@]}" = 2 ] && [ -n "${cores[0]}" ] && [ -n "${cores[1]}" ] ||
  { echo "wait_sleeps.sh: needs two cores this shell may use, one per worker" >&2; exit 1; }
DTRAIN_BIN_DIR="$build" DTRAIN_LOCAL_DIR="$work" \
  deploy/local/cluster.sh start --port 0 --workers 2 --threads 1 >&2
DTRAIN_COORDINATOR="127.0.0.1:$(cat "$work/port")"
export DTRAIN_COORDINATOR

submit() {  # steps
  bench_job_submit "$build" --name="wait-sleeps-$model" --model.builtin="$model" \
    --data.batch_size=64 --trainer.max_steps="$1" --trainer.strategy=ddp --trainer.num_nodes=2
}
# Each worker's step thread (bench/thread_cpu.py's rule: its busiest thread, here among those
# pinned to a single core, as the local cluster pins a step thread and a thread it starts).
step_threads() {
  local pids
  pids=$(cat "$work"/worker-*.pid | paste -sd, -)
  /usr/bin/python3 "$root/bench/thread_cpu.py" step-threads --pinned --workers "$pids"
}
switches() {  # pid/tid...: each one's voluntary context switches
  local t
  for t in "$@"; do awk '/^voluntary_ctxt_switches/ {print $2}' "/proc/${t%/*}/task/${t#*/}/status"; done
}
# The window starts and ends as the job's progress moves (a training call's answer), so that
# the steps counted are about the ones made between the two readings (each reading lags the
# answer by up to one status query, on both edges alike).
at_progress_change() {  # id: waits for the global step to change, prints it
  local id=$1 was now deadline=$((SECONDS + 10))
  was=$(bench_job_progress "$build" "$id")
  while (( SECONDS < deadline )); do
    now=$(bench_job_progress "$build" "$id")
    if [[ $now =~ ^[0-9]+$ && $was =~ ^[0-9]+$ && $now != "$was" ]]; then echo "$now"; return; fi
    [[ $was =~ ^[0-9]+$ ]] || was=$now
    sleep 0.02  # each query starts the client on the cores the ranks step on
  done
  echo "wait_sleeps.sh: the job made no progress for 10 s" \
    "(it is $(bench_job_state "$build" "$id"))" >&2
  exit 1
}

bench_job_wait "$build" "$(submit 20)" >/dev/null   # the warm job, as training.sh's
id=$(submit "$steps")
sleep 5
mapfile -t threads < <(step_threads)
[ "${#threads[@]}" = 2 ] ||
  { echo "wait_sleeps.sh: found ${#threads[@]} pinned step threads, not 2" >&2; exit 1; }
first=$(at_progress_change "$id"); mapfile -t before < <(switches "${threads[@]}")
sleep "$window"
last=$(at_progress_change "$id"); mapfile -t after < <(switches "${threads[@]}")
[ "${#before[@]}" = 2 ] && [ "${#after[@]}" = 2 ] ||
  { echo "wait_sleeps.sh: a step thread ended in the window" >&2; exit 1; }
bench_job_wait "$build" "$id"
rate=$(bench_job_result "$build" "$id" "wait_sleeps.sh: the job" | /usr/bin/python3 -c '
import json, sys; print(json.load(sys.stdin)["samples_per_s"])')
latency=$("$build/bench/dtrain-bench-wake-latency" --cpus "${cores[0]},${cores[1]}")
echo "$latency"
/usr/bin/python3 - "$model" "$first" "$last" "$rate" "${before[*]}" "${after[*]}" "$latency" <<'EOF'
import json, sys
model, first, last, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
before, after = map(int, sys.argv[5].split()), map(int, sys.argv[6].split())
extra = next(json.loads(l) for l in sys.argv[7].splitlines() if 'futex_extra' in l)
extra_us = extra['futex_extra_mean_us']  # an expected cost: the mean, its tail included
poll = next(json.loads(l) for l in sys.argv[7].splitlines() if '"poll"' in l)
if poll['mean_us'] > 50:
    # A poll answers in about a microsecond unless something else holds the waiter's CPU.
    print(f'warning: the poll\'s mean wake-up took {poll["mean_us"]:.0f} us: other work ran on '
          'these CPUs, so the cost below says little')
steps = last - first
if steps <= 0:
    sys.exit(f'wait_sleeps.sh: no steps in the window (global step {first} to {last})')
step_us = 2 * 64 / rate * 1e6  # the job's time per optimizer step (2 ranks of 64 samples)
for rank, (b, a) in enumerate(zip(before, after)):
    per_step = (a - b) / steps
    cost = per_step * extra_us
    print(f'{model} rank {rank}: {a - b} sleeps in {steps} steps, {per_step:.3f} a step; at a '
          f'wake-up\'s mean extra {extra_us:.1f} us (same run) that is {cost:.1f} us a step of the '
          f'job\'s {step_us:.0f} us ({cost / step_us:.2%}; {rate:.0f} samples/s)')
EOF

#!/usr/bin/env bash
# What dtrain's services take from a training job's cores, and what that costs the job.
# 1. Every thread on this machine over a window in the middle of a 2-worker ddp job (the
#    training bench's spec): CPU time (schedstat, in ns), wake-ups and preemptions per second,
#    from /proc/<pid>/task/<tid>/. Each worker's step thread (its busiest) is shown apart from
#    every other thread: the coordinator's, the workers' others, other processes'. Not all of
#    them run beside the steps: the coordinator's job thread sleeps through each step call.
# 2. --rounds alternated pairs of the same job (a new cluster each): alone, and beside a burner
#    process that is busy 1 ms in every 50 ms on whichever core the scheduler gives it. A
#    synchronous job stalls both ranks for a stall on either core, so it pays more than the
#    burner's CPU time; the ratio of the two is the factor docs/BENCHMARKS.md ("What the MLP's
#    job loses, part by part") applies to the services' threads.
#   bench/services_cpu.sh [--model mlp|cnn] [--seconds N] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
model=mlp; seconds=20; rounds=8
usage() {
  echo "usage: bench/services_cpu.sh [--model mlp|cnn] [--seconds 1-600] [--rounds 0-100]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --model) model=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) usage ;;
  esac
done
case "$model" in mlp|cnn) ;; *) echo "--model: mlp or cnn" >&2; exit 2 ;; esac
# Decimal digits only, read as base 10 (so 010 is ten, and no overflow gets past the bounds).
[[ "$seconds" =~ ^[0-9]{1,3}$ ]] && seconds=$((10#$seconds)) && [ "$seconds" -ge 1 ] &&
  [ "$seconds" -le 600 ] || { echo "--seconds: a whole number from 1 to 600" >&2; exit 2; }
[[ "$rounds" =~ ^[0-9]{1,3}$ ]] && rounds=$((10#$rounds)) && [ "$rounds" -le 100 ] ||
  { echo "--rounds: a whole number from 0 to 100" >&2; exit 2; }
deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain >&2

# Steps per second of each model's job, several times the project's machines' (~1,450 and ~55):
# the window's job must outlast the window on a faster machine too (it is cancelled after it).
# The rounds' jobs are the A/B's (~3-10 s here).
declare -A rate=([mlp]=10000 [cnn]=500) round_steps=([mlp]=5000 [cnn]=600)
work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
burner=""
cleanup() {
  [ -n "$burner" ] && kill "$burner" 2>/dev/null || true
  deploy/local/cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

source "$root/bench/bench_job.sh"
submit() {  # max_steps -> job id
  bench_job_submit "$build" --name="services-cpu-$model" --model.builtin="$model" \
    --trainer.max_steps="$1"
}
start_cluster() {
  deploy/local/cluster.sh start --port 0 --workers 2 >&2
  export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
}

# 1. The window, once the job has trained for a few seconds.
start_cluster
id=$(submit $(( (seconds + 10) * ${rate[$model]} )))
[ -n "$id" ] || { echo "services_cpu: the job was not submitted (above)" >&2; exit 1; }
# Sampled once the job trains (setup and the first calls behind it).
for _ in $(seq 1 120); do
  state=$(bench_job_state "$build" "$id")
  [ "$state" = RUNNING ] && break
  sleep 0.5
done
if [ "$state" != RUNNING ]; then
  echo "services_cpu: the job is $state, not RUNNING, after 60 s" >&2
  exit 1
fi
sleep 3
echo "sampling every thread for ${seconds} s of $model job $id ..." >&2
/usr/bin/python3 - "$seconds" <<'PY'
import collections, os, sys, time

def cmd(pid):
    try:
        argv = open(f"/proc/{pid}/cmdline").read().split("\0")
    except OSError:
        return "?"
    if not argv[0]:
        return "kernel"
    name = os.path.basename(argv[0])[:24]
    for a in argv:
        if a.startswith("--name="):
            name += " " + a[len("--name="):]
    return name

def snapshot():
    threads = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                status = open(f"/proc/{pid}/task/{tid}/status").read()
                on_cpu_ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            switches = {l.split(":")[0]: int(l.split()[1]) for l in status.splitlines()
                        if l.endswith(tuple("0123456789")) and "ctxt_switches" in l}
            threads[(pid, tid)] = (comm, on_cpu_ns,
                                   switches.get("voluntary_ctxt_switches", 0),
                                   switches.get("nonvoluntary_ctxt_switches", 0))
    return time.monotonic(), threads

t0, before = snapshot()
time.sleep(float(sys.argv[1]))
t1, after = snapshot()
# Threads that ended inside the window are not counted (none of dtrain's do while it trains).
span = t1 - t0
me = str(os.getpid())
names = {pid: cmd(pid) for pid, _ in after}
rows = []  # (process, thread, pid, tid, cpu ms/s, wake-ups/s, preempted/s)
for key, (comm, cpu, vol, invol) in after.items():
    _, cpu0, vol0, invol0 = before.get(key, (comm, 0, 0, 0))
    if key[0] == me:
        continue
    rows.append((names[key[0]], comm, key[0], key[1], (cpu - cpu0) / 1e6 / span,
                 (vol - vol0) / span, (invol - invol0) / span))
step = {}
for r in rows:
    if r[0].startswith("dtrain-worker") and r[4] > step.get(r[2], (0, 0, 0, 0, 0))[4]:
        step[r[2]] = r
groups = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
for r in rows:
    if step.get(r[2]) is r:
        label = (r[0], "step thread")
    else:
        label = (r[0], r[1])
    g = groups[label]
    g[0] += r[4]; g[1] += r[5]; g[2] += r[6]; g[3] += 1
print(f"window: {span:.1f} s (this script's own threads left out)")
print(f"{'process':34} {'thread(s)':22} {'n':>3} {'CPU ms/s':>9} {'wake-ups/s':>11} "
      f"{'preempted/s':>12}")
for (proc, thread), (cpu, vol, invol, n) in sorted(groups.items(), key=lambda g: -g[1][0]):
    if cpu >= 0.5 or vol >= 5:
        print(f"{proc:34} {thread:22} {n:>3} {cpu:>9.1f} {vol:>11.1f} {invol:>12.1f}")
def total(pred):
    return sum(c for (p, t), (c, _, _, _) in groups.items() if pred(p, t))
services = total(lambda p, t: p.startswith("dtrain-") and t != "step thread")
steps = total(lambda p, t: t == "step thread")
others = total(lambda p, t: not p.startswith("dtrain-"))
print(f"step threads: {steps:.1f} ms/s in all; dtrain's other threads: {services:.1f} ms/s; "
      f"other processes: {others:.1f} ms/s")
PY
state=$(bench_job_state "$build" "$id")
if [ "$state" != RUNNING ]; then
  echo "services_cpu: the job was $state before the window ended: the figures above cover" \
    "less than a training job" >&2
  exit 1
fi
"$build/client/dtrain" cancel "$id" >/dev/null 2>&1 || true
deploy/local/cluster.sh stop >&2
[ "$rounds" -gt 0 ] || exit 0

# 2. The job alone and beside the burner, alternated.
one() {  # alone|burner round
  start_cluster
  local id before=0 after=0 t0 t1
  if [ "$1" = burner ]; then
    /usr/bin/python3 -c '
import time
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.001: pass
    time.sleep(0.049)' &
    burner=$!
  fi
  # The burner's CPU is counted from after Python's start (~20 ms of its own), in ns.
  [ -n "$burner" ] && sleep 0.5 && before=$(cut -d' ' -f1 "/proc/$burner/schedstat")
  t0=$(date +%s.%N)
  id=$(submit "${round_steps[$model]}")
  [ -n "$id" ] || { echo "services_cpu: the job was not submitted (above)" >&2; exit 1; }
  # A job that does not end in 10 min is cancelled (and reported failed below), not waited for.
  bench_job_wait "$build" "$id"
  t1=$(date +%s.%N)
  [ -n "$burner" ] && after=$(cut -d' ' -f1 "/proc/$burner/schedstat")
  if [ -n "$burner" ]; then kill "$burner"; wait "$burner" 2>/dev/null || true; burner=""; fi
  "$build/client/dtrain" status "$id" --output json | /usr/bin/python3 -c "
import json, sys
s = json.load(sys.stdin)
print(json.dumps({'mode': '$1', 'round': $2, 'state': s['state'],
                  'samples_per_s': s.get('progress', {}).get('train_samples_per_second', 0),
                  'burner_ms_per_s': ($after - $before) / 1e6 / ($t1 - $t0)}))" \
    >> "$work/rounds.jsonl"
  deploy/local/cluster.sh stop >&2
}
: > "$work/rounds.jsonl"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: $model job alone and beside the burner ..." >&2
  if [ $((r % 2)) = 1 ]; then
    one alone "$r"; one burner "$r"
  else
    one burner "$r"; one alone "$r"
  fi
done
/usr/bin/python3 - "$work/rounds.jsonl" "$model" <<'PY'
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = [r for r in rows if r["state"] != "SUCCEEDED"]
if bad:
    sys.exit(f"jobs failed: {bad}")
by = {(r["round"], r["mode"]): r for r in rows}
ratios = [by[(n, "burner")]["samples_per_s"] / by[(n, "alone")]["samples_per_s"]
          for n in sorted({r["round"] for r in rows})]
geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
burn = statistics.median(r["burner_ms_per_s"] for r in rows if r["mode"] == "burner")
print(f"\n{sys.argv[2]} job beside the burner over alone, {len(ratios)} alternated rounds: "
      + " ".join(f"{x:.3f}" for x in ratios)
      + f"; geometric mean {geo:.3f}, median {statistics.median(ratios):.3f}")
print(f"the burner took {burn:.1f} ms/s of CPU (median), so the job "
      f"paid ~{(1 - geo) * 1000 / burn:.2f}x the CPU time it took")
PY

#!/usr/bin/env bash
# The README demo's job, measured as a user runs it, beside the compute ceiling of the same run:
#   bench/demo.sh [--runs N] [--config FILE] [--check] [--json]
# Each run: the compute ceiling (bench/ceiling.sh: two plain libtorch processes, pinned like the
# workers, each computing the demo's whole job with no communication: both ranks' batches, their
# mean gradient and the updates, at the demo's batch size, Nesterov momentum, the job's batches (its
# sampler's order of each epoch), epochs and cosine schedule, so that the ceiling trains the model
# the job trains), then a fresh local cluster (deploy/local/cluster.sh, as deploy/local/demo.sh
# starts it) running the unchanged demo spec (deploy/local/fashion-cnn.yaml) submitted and watched
# as demo.sh does, then the ceiling again; the run's ceiling is the faster of its two samples. Then
# loops each training its own model (the ceiling until 2026-11-30; since 2026-12-01 they read the
# job's batches, so their rows compare with earlier tables only roughly), and last the lockstep
# ceiling (bench/ceiling.sh: one loop per rank, the two averaging their gradients every step in
# place in shared memory, as the shm plane's ddp does), a sample of what a synchronous job with
# dtrain's exchange and no service can reach. Per run it prints the time from submit to SUCCEEDED,
# the training rate (samples over the training span: first training step to the last, validation and
# checkpoints between them left out), its share of the ceiling and of the lockstep ceiling, the rate
# dtrain reports (which counts from before the sanity check to the run's end), where the seconds
# went, and test_acc; then the medians with their spread, whether the ceiling trained the job's
# model (the parameters' sum of the job's last checkpoint against the ceiling's), and the machine. A
# run whose job beat its ceiling measured a slowed ceiling, not a fast job: it is void, left out of
# the share's median and counted. The lockstep medians keep every sample and count the runs whose
# job beat its sample (one sample a run, not the better of two). A valid run whose ranks' forward
# differed by over 15% (the job log's profile: one core slowed for the job's span) is counted, and
# the share is also given without such runs (unless every valid run is one); they stay in the
# median, as a rank made slower by dtrain would look the same. Runs where a step thread waited over
# 5% of its time for its core (the log's time by rank) are counted too, and every run names the
# CPU that threads other than the step threads took from submit to done (bench/thread_cpu.py).
# --check exits 1 unless the median share of the ceiling is >= 0.90, every test_acc >= 0.91 and
# the ceiling trained the job's model in every run compared (at least one).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
runs=3; config="$root/deploy/local/fashion-cnn.yaml"; check=0; json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift ;;
    --config) config=$(realpath "$2"); shift ;;
    --check) check=1 ;;
    --json) json=1 ;;
    *) echo "usage: bench/demo.sh [--runs N] [--config FILE] [--check] [--json]" >&2; exit 2 ;;
  esac
  shift
done

deploy/install-deps.sh --bench >&2
build="$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >&2
cmake --build "$build" --target dtrain-coordinator dtrain-worker dtrain dtrain-bench-train-loop >&2

# The spec's model, batch, optimizer, schedule, length and row order, for a ceiling training its
# model.
read -r model batch nesterov lr cosine epochs max_steps shuffle seed < <(/usr/bin/python3 - "$config" <<'PY'
import sys, yaml
path = sys.argv[1]
spec = yaml.safe_load(open(path)) or {}
def part(name):
    return spec.get(name) or {}
model = part("model").get("builtin", "")
if model not in ("cnn", "mlp"):
    sys.exit(f"bench/demo.sh measures a zoo model (cnn or mlp) against its ceiling; {path} names {model!r}")
trainer, schedule = part("trainer"), part("lr_scheduler")
ranks = trainer.get("num_nodes", 1), trainer.get("devices", 1)
if not all(isinstance(r, int) for r in ranks) or ranks[0] * ranks[1] != 2:
    sys.exit(f"bench/demo.sh measures a 2-rank job against a 2-core ceiling; {path} has {ranks}")
# The ceiling's loop knows a constant rate and a cosine to 0 over the whole run.
if schedule.get("name", "none") not in ("none", "cosine") or schedule.get("min_lr") or schedule.get("total_steps"):
    sys.exit(f"bench/demo.sh's ceiling follows no lr_scheduler or a cosine to 0 over the run; {path} gives {schedule}")
# The loops know SGD with momentum 0.9 (Nesterov or not) over every batch of the training set.
opt, data = part("optimizer"), part("data")
unfollowed = [f"{name}: {value!r}" for name, value, ok in (
    ("optimizer.name", opt.get("name", "sgd"), opt.get("name", "sgd") == "sgd"),
    ("optimizer.momentum", opt.get("momentum"), float(opt.get("momentum") or 0) == 0.9),
    ("optimizer.weight_decay", opt.get("weight_decay"), not opt.get("weight_decay")),
    ("data.limit_train_samples", data.get("limit_train_samples"), not data.get("limit_train_samples")),
    ("trainer.accumulate_grad_batches", trainer.get("accumulate_grad_batches"),
     int(trainer.get("accumulate_grad_batches") or 1) == 1),
    ("trainer.limit_train_batches", trainer.get("limit_train_batches"), not trainer.get("limit_train_batches")),
    ("trainer.limit_train_fraction", trainer.get("limit_train_fraction"), not trainer.get("limit_train_fraction")))
    if not ok]
if unfollowed:
    sys.exit(f"bench/demo.sh's ceiling trains with SGD at momentum 0.9, no weight decay, on every "
             f"batch with no accumulation; {path} gives {', '.join(unfollowed)}")
epochs, max_steps = int(trainer.get("max_epochs") or 0), int(trainer.get("max_steps") or 0)
if (epochs > 0) == (max_steps > 0):
    sys.exit(f"bench/demo.sh's ceiling runs the job's length: give {path} max_epochs or max_steps, not both")
print(model, data.get("batch_size", 32), int(bool(opt.get("nesterov", False))),
      opt.get("lr", 0.01), int(schedule.get("name") == "cosine"), epochs, max_steps,
      int(bool(data.get("shuffle", True))), int(spec.get("seed_everything") or 0))
PY
)
[ -n "$model" ] || exit 2  # the spec was refused (above)
mapfile -t pins < <(deploy/local/cluster.sh cpus --workers 2)

work=$(mktemp -d)
export DTRAIN_LOCAL_DIR="$work/cluster"
cleanup() { deploy/local/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
source "$root/bench/ceiling.sh"
source "$root/bench/bench_job.sh"
ceiling_flags=(--lr "$lr")
[ "$nesterov" = 1 ] && ceiling_flags+=(--nesterov)
# The loops start from the job's weights and read its batches (its sampler's order of each
# epoch): both by its seed.
ceiling_flags+=(--seed "$seed")
[ "$shuffle" = 1 ] && ceiling_flags+=(--shuffle)
[ "$cosine" = 1 ] && ceiling_flags+=(--cosine)
# The job's whole run: the cost of a step changes along the trajectory (max-pooling's, as the
# model trains and lr anneals), so a ceiling of the first few hundred steps would not do the
# job's work. The spec's max_steps or its max_epochs, whichever it gives.
ceiling_steps=$max_steps
# --epochs overrides the loops' --steps, so STEPS is a placeholder then.
if [ "$max_steps" -le 0 ]; then ceiling_flags+=(--epochs "$epochs"); ceiling_steps=1; fi

: > "$work/rows.jsonl"
for run in $(seq 1 "$runs"); do
  echo "run $run/$runs: compute ceiling ..." >&2
  ceiling_once "$build" "$work" "$model" "$batch" "$ceiling_steps" "$run" "${ceiling_flags[@]}" \
    > "$work/ceiling-a.json"
  echo "run $run/$runs: the demo job on a fresh local cluster ..." >&2
  deploy/local/cluster.sh start --port 0 --workers 2 >&2
  export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
  # Every thread's CPU time around the job, to name what took the step threads' cores.
  /usr/bin/python3 bench/thread_cpu.py snapshot "$work/cpu-before.json"
  id=$(bench_submit "$build" "$config")
  bench_job_wait "$build" "$id"
  /usr/bin/python3 bench/thread_cpu.py snapshot "$work/cpu-after.json"
  /usr/bin/python3 bench/thread_cpu.py diff "$work/cpu-before.json" "$work/cpu-after.json" \
    --workers="$(cat "$DTRAIN_LOCAL_DIR"/worker-*.pid | paste -sd,)" > "$work/cpu.json"
  "$build/client/dtrain" status "$id" --output json > "$work/status.json"
  "$build/client/dtrain" results "$id" --output json > "$work/results.json"
  # The trained model, to check that the ceiling trained the same one (below).
  rm -rf "$work/job-files"
  "$build/client/dtrain" download "$id" last -o "$work/job-files" >&2 || true
  # Where the ranks' time went (steps, waits for gradients and data), for the reader.
  "$build/client/dtrain" logs "$id" | grep -E "time by rank|time per batch|trained at" \
    > "$work/job-profile.txt" || true
  cat "$work/job-profile.txt" >&2
  deploy/local/cluster.sh stop >&2
  echo "run $run/$runs: compute ceiling again ..." >&2
  ceiling_once "$build" "$work" "$model" "$batch" "$ceiling_steps" "$run" "${ceiling_flags[@]}" \
    > "$work/ceiling-b.json"
  echo "run $run/$runs: the ceiling of loops training their own models ..." >&2
  own_ceiling_once "$build" "$work" "$model" "$batch" "$ceiling_steps" "$run" "${ceiling_flags[@]}" \
    > "$work/own-ceiling.json"
  # What a synchronous job could keep here: loops running the shm plane's exchange, no service.
  echo "run $run/$runs: lockstep ceiling ..." >&2
  lockstep_once "$build" "$work" "$model" "$batch" "$ceiling_steps" "$run" "${ceiling_flags[@]}" \
    > "$work/lockstep.json"
  # The loops' batch by phase, beside the job's "time per batch by rank" above.
  /usr/bin/python3 -c '
import json, sys
row = json.load(open(sys.argv[1]))
parts = ["rank %d %.3f ms: data %.3f, forward %.3f, backward %.3f, averaging gradients %.3f, "
         "optimizer %.3f" % (r, sum(p), *p) for r, p in enumerate(row["phases_ms"]) if p]
print("lockstep loops, time per batch by rank: " + "; ".join(parts))' "$work/lockstep.json" >&2
  /usr/bin/python3 - "$work" "$run" "$batch" >> "$work/rows.jsonl" <<'PY'
import json, re, sys
work, run, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Each rank's forward in ms a batch, from the job log's profile ("rank 0 X ms: data D, forward F,
# ..."). Both ranks run the same model on same-sized batches, each on a core of its own, so a
# forward much slower on one rank than on the other is that core slowed (this VM's cores lose up to
# a third, for seconds or for a whole job), which the faster rank then waits for at every step.
profile = open(f"{work}/job-profile.txt").read()
forwards = [float(f) for f in re.findall(r"rank \d+ [0-9.]+ ms: data [0-9.]+, forward ([0-9.]+)",
                                          profile)]
forward_skew = None
if len(forwards) >= 2 and min(forwards) > 0:
    forward_skew = max(forwards) / min(forwards) - 1
# Each rank's wait for its core, as a share of its time in steps ("... for its core" in the
# log's time by rank): other threads runnable on the step thread's core.
core_waits = [float(w) / 100 for w in re.findall(r"\(([0-9.]+)%\) for its core", profile)]
s = json.load(open(f"{work}/status.json"))
if s.get("state") != "SUCCEEDED":
    sys.exit(f"run {run}: the demo job ended {s.get('state')}: {s.get('reason', '')}")
ceilings = [json.load(open(f"{work}/ceiling-{x}.json")) for x in "ab"]
ceiling = max(ceilings, key=lambda c: c["samples_per_s"])
lockstep = json.load(open(f"{work}/lockstep.json"))
own = json.load(open(f"{work}/own-ceiling.json"))
p = s["progress"]
phases = p.get("phase_seconds", {})
samples = int(p["global_step"]) * batch * 2
# The training span's rate; before dtrain reported it, the train phase's time (calls only).
rate = p.get("train_samples_per_second") or samples / phases["train"]
found = re.search(r'"test_acc": ([0-9.]+)', open(f"{work}/results.json").read())
acc = float(found.group(1)) if found else float("nan")  # a spec with skip_test
# The job's last checkpoint against the ceiling's parameters: the ceiling starts from the job's
# weights, reads its batches and computes its ranks' steps with the same kernels, so its
# processes end on the job's model and their sums agree. Compared to the 9 digits the loops
# print: Python's sum may add in another order. A ruler that trained another model would bound
# other work.
job_sum = None
try:
    import torch
    # weights_only=False: Debian's torch 1.13 lacks weights_only's float opcode (the tests check
    # that newer torch loads these files weights only); the file is this run's own.
    state = torch.load(f"{work}/job-files/last.ckpt", map_location="cpu", weights_only=False)
    job_sum = float("%.9g" % sum(v.double().sum().item() for v in state["state_dict"].values()
                                 if v.is_floating_point()))
except Exception as e:  # a spec that keeps no checkpoint, or no torch here: not compared
    print(f"run {run}: the job's last checkpoint not compared with the ceiling: {e!r}",
          file=sys.stderr)
print(json.dumps({
    "run": run, "submit_to_done_s": (int(s["finished_unix_ms"]) - int(s["submitted_unix_ms"])) / 1000,
    "train_samples_per_s": round(rate, 1), "reported_samples_per_s": round(p["samples_per_second"], 1),
    "ceiling_samples_per_s": ceiling["samples_per_s"],
    "ceiling_samples": [c["samples_per_s"] for c in ceilings],
    "synchronous_share": ceiling["synchronous_share"],
    "lockstep_samples_per_s": lockstep["samples_per_s"],
    "share_of_lockstep": round(rate / lockstep["samples_per_s"], 4),
    "lockstep_of_ceiling": round(lockstep["samples_per_s"] / ceiling["samples_per_s"], 4),
    "share_of_ceiling": round(rate / ceiling["samples_per_s"], 4),
    "own_ceiling_samples_per_s": own["samples_per_s"],
    "share_of_own_ceiling": round(rate / own["samples_per_s"], 4),
    "job_parameters_sum": job_sum, "ceiling_parameters_sum": ceiling.get("parameters_sum"),
    "same_model": None if job_sum is None else job_sum == ceiling.get("parameters_sum"),
    "forward_skew": None if forward_skew is None else round(forward_skew, 4),
    "core_wait": max(core_waits) if core_waits else None,
    "cpu_around_job": json.load(open(f"{work}/cpu.json")),
    "test_acc": acc, "global_step": int(p["global_step"]),
    "phase_seconds": {k: round(v, 2) for k, v in phases.items()}}))
PY
done

machine=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
echo "{\"machine\": \"$machine, $(nproc) cores\", \"kernel\": \"$(uname -r)\"}" >> "$work/rows.jsonl"
if [ "$json" = 1 ]; then cat "$work/rows.jsonl"; fi
/usr/bin/python3 - "$work/rows.jsonl" "$check" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
machine = rows.pop()["machine"]
print(f"{'run':>3} {'submit->done s':>14} {'train samples/s':>15} {'ceiling':>8} {'share':>6} "
      f"{'of sync bound':>13} {'own-model':>9} {'share':>6} {'lockstep':>8} {'of lockstep':>11} "
      f"{'reported':>8} {'test_acc':>8} {'fwd skew':>8}  phases (s)")
# A run whose ranks' forward differed by more than this ran on a slowed core (above).
SLOWED_CORE_SKEW = 0.15
def fmt_skew(r):
    return "-" if r.get("forward_skew") is None else f"{r['forward_skew']:.3f}"
for r in rows:
    ph = r["phase_seconds"]
    print(f"{r['run']:>3} {r['submit_to_done_s']:>14.1f} {r['train_samples_per_s']:>15.0f} "
          f"{r['ceiling_samples_per_s']:>8.0f} {r['share_of_ceiling']:>6.3f} "
          f"{r['share_of_ceiling'] / r['synchronous_share']:>13.3f} "
          f"{r['own_ceiling_samples_per_s']:>9.0f} {r['share_of_own_ceiling']:>6.3f} "
          f"{r['lockstep_samples_per_s']:>8.0f} {r['share_of_lockstep']:>11.3f} "
          f"{r['reported_samples_per_s']:>8.0f} "
          f"{r['test_acc']:>8.4f} {fmt_skew(r):>8}  " + ", ".join(f"{k} {ph[k]}" for k in
          ("setup", "train", "validation", "checkpoint", "test") if k in ph))
def spread(key, among=rows):
    v = [r[key] for r in among] or [float("nan")]
    return statistics.median(v), min(v), max(v)
valid = [r for r in rows if r["share_of_ceiling"] <= 1]
t, s, a = spread("submit_to_done_s"), spread("share_of_ceiling", valid), spread("test_acc")
c = spread("ceiling_samples_per_s")
print(f"void runs (the job above the run's ceiling): {len(rows) - len(valid)} of {len(rows)}")
o = spread("share_of_own_ceiling")
print(f"against loops training their own models (the ceiling until 2026-11-30): "
      f"{o[0]:.3f} ({o[1]:.3f}-{o[2]:.3f})")
print(f"median of {len(rows)} ({len(valid)} valid for the share): submit to SUCCEEDED {t[0]:.1f} s ({t[1]:.1f}-{t[2]:.1f}); training at "
      f"{s[0]:.3f} of the same run's ceiling ({s[1]:.3f}-{s[2]:.3f}), the ceiling being "
      f"{c[0]:.0f} samples/s ({c[1]:.0f}-{c[2]:.0f}); test_acc {a[0]:.4f} ({a[1]:.4f}-{a[2]:.4f})")
# Reported, not left out: a core slowed for the job's span is this machine's, but a rank made
# slower by dtrain would look the same, so the median above keeps these runs.
slowed = [r for r in valid if (r.get("forward_skew") or 0) > SLOWED_CORE_SKEW]
even = spread("share_of_ceiling", [r for r in valid if r not in slowed])
print(f"runs where one rank's forward was over {SLOWED_CORE_SKEW:.0%} slower than the other's "
      f"(a slowed core): {len(slowed)} of {len(valid)} valid"
      + (f"; without them the share is {even[0]:.3f} ({even[1]:.3f}-{even[2]:.3f})"
         if slowed and len(slowed) < len(valid) else ""))
# Reported and kept in the median, as a slowed core is: the threads that took the cores may be
# the job's own (the coordinator, the workers' other threads).
CORE_WAIT = 0.05
shared = [r for r in rows if (r.get("core_wait") or 0) > CORE_WAIT]
print(f"runs where a step thread waited over {CORE_WAIT:.0%} of its time in steps for its core "
      f"(other threads ran there): {len(shared)} of {len(rows)}")
for r in rows:
    c = r.get("cpu_around_job")
    if not c:
        continue
    wait = "-" if r.get("core_wait") is None else f"{r['core_wait']:.1%}"
    print(f"  run {r['run']}: a step thread's wait for its core at most {wait}; from submit to done "
          f"the step threads ran {c['step_threads_s']} s, everything else {c['others_s']} s "
          f"(the machine busy {c['machine_busy_s']} s); most: "
          + ", ".join(f"{n} {sec} s" for n, sec in c["largest_others"]))
# One sample a run (the ceiling has two), so a slowed one is likelier; all are kept, and the runs
# whose job beat its sample are counted: when that is every run, the loops lost to the job.
above = [r for r in rows if r["share_of_lockstep"] > 1]
k, j = spread("lockstep_of_ceiling", rows), spread("share_of_lockstep", rows)
print(f"lockstep ceiling (a loop per rank, averaging gradients in place each step as the shm "
      f"plane does, no service): {k[0]:.3f} of the run's ceiling ({k[1]:.3f}-{k[2]:.3f}); the job "
      f"at {j[0]:.3f} of it ({j[1]:.3f}-{j[2]:.3f}), above it in {len(above)} of {len(rows)} runs")
compared = [r for r in rows if r.get("same_model") is not None]
same = [r for r in compared if r["same_model"]]
print(f"the ceiling trained the job's model (their parameters' sums equal to 9 digits) in "
      f"{len(same)} of {len(compared)} runs compared"
      + "".join(f"; run {r['run']}: job {r['job_parameters_sum']!r}, ceiling "
                f"{r['ceiling_parameters_sum']!r}" for r in compared if not r["same_model"]))
print(f"machine: {machine}")
if sys.argv[2] == "1" and (not valid or s[0] < 0.90 or a[1] < 0.91 or not compared
                           or len(same) < len(compared)):
    print("check FAILED: wants a median share >= 0.90, every test_acc >= 0.91 and the ceiling "
          "training the job's model in every run compared (at least one)")
    sys.exit(1)
PY

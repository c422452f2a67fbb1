#!/usr/bin/env bash
# GPU check: the first thing to run on a machine with NVIDIA GPUs and a dtrain-worker built
# against a CUDA libtorch (docs/OPERATIONS.md, "Building the worker against CUDA libtorch").
# It starts local clusters on 127.0.0.1 with deploy/local/cluster.sh (free ports, state in a
# temporary directory), trains the README demo's CNN on Fashion-MNIST for a few steps in each
# case below with the dtrain CLI, and prints a Markdown table: case | result | samples/s.
#   single_device    one rank on cuda:0, 32-true
#   ddp xN           one worker daemon and rank per visible GPU (ranks on cuda:<local rank>),
#                    collective_backend auto: the plane the job got is in the result
#   dp xN            one worker, N replicas (replica i on cuda:i)
#   16-mixed         single_device, CUDA autocast to float16 with loss scaling
#   bf16-mixed       single_device, CUDA autocast to bfloat16
#   ckpt gpu->cpu    a single_device job on a GPU, its last.ckpt downloaded, then a job resuming
#                    from it with accelerator cpu on a CPU-only worker (a second local cluster
#                    whose worker sees no GPU: CUDA_VISIBLE_DEVICES empty)
#   ckpt cpu->gpu    the reverse
# A case passes when its job SUCCEEDED at the expected global step with a finite train_loss
# below 2.0 (an untrained 10-class model's is ln 10, 2.30), and, for a checkpoint case, its log
# says it resumed at the first job's last step. samples/s is the trainer's own rate, as
# bench/training.sh reads it (JobStatus.progress.samples_per_second: every rank's training
# samples from the start of fit to its end, over a spec without validation or test); for a
# checkpoint case, the resumed job's. The run is a check, not a benchmark: the CNN is small and
# the runs are short.
# Without a GPU (nvidia-smi lists none) or without a CUDA build of the worker it says which is
# missing and exits 0 at once, building nothing. Otherwise it exits 1 when any case failed, and
# then prints the end of each failed job's log.
#   bench/gpu_check.sh [--steps N] [--batch B] [--timeout S] [--keep]
# --steps: optimizer steps per case (default 100; each checkpoint job takes half; the loss check
#          wants a few dozen at least);
# --batch: batch size per rank (default 256; dp splits it over its replicas);
# --timeout: seconds each job may take from submission to its end (default 600);
# --keep: keep the temporary directory (worker and coordinator logs, job specs) and say where.
# The binaries: $DTRAIN_BIN_DIR if set (as deploy/local/cluster.sh reads it), else build-cuda/
# when it holds a dtrain-worker, else build/. GPUs: those nvidia-smi -L lists, or as many as
# $CUDA_VISIBLE_DEVICES names when it is set. $DTRAIN_WORKER_FLAGS, if set, goes to every worker.
set -euo pipefail
caller_dir=$(pwd)
cd "$(dirname "$0")/.."
root=$(pwd)
usage="usage: bench/gpu_check.sh [--steps N] [--batch B] [--timeout S] [--keep]"
steps=100; batch=256; timeout_s=600; keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for n in "$steps" "$batch" "$timeout_s"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "$usage (positive whole numbers)" >&2; exit 2; }
done
accel=gpu

if [ -n "${DTRAIN_BIN_DIR:-}" ]; then
  bin=$DTRAIN_BIN_DIR
  [[ $bin == /* ]] || bin=$caller_dir/$bin
elif [ -x "$root/build-cuda/worker/dtrain-worker" ]; then
  bin=$root/build-cuda
else
  bin=$root/build
fi
worker=$bin/worker/dtrain-worker

# --- What this machine has: GPUs, and a worker that links a CUDA libtorch. Nothing is built. ---
missing=()
ngpu=0
if ! command -v nvidia-smi >/dev/null 2>&1; then
  missing+=("no GPU (nvidia-smi is not installed: no NVIDIA driver)")
elif ! gpu_list=$(timeout --foreground 30 nvidia-smi -L 2>&1); then
  missing+=("no GPU (nvidia-smi -L failed: $(head -1 <<<"$gpu_list"))")
else
  ngpu=$(grep -c '^GPU ' <<<"$gpu_list" || true)
  gpu_names=$(awk -F' [(]UUID' '/^GPU /{sub(/^GPU [0-9]+: /, ""); print $1}' <<<"$gpu_list" | sort | uniq -c |
              awk '{n=$1; $1=""; printf "%s%dx%s", (NR>1 ? ", " : ""), n, $0}')
  # Compute capability (bf16 needs 8.0 for speed); older drivers cannot say.
  gpu_caps=$(timeout --foreground 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
             sort -u | paste -sd, - || true)
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    [ "${#visible[@]}" -lt "$ngpu" ] && ngpu=${#visible[@]}
  fi
  if [ "$ngpu" -eq 0 ]; then
    missing+=("no GPU (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them all)")
  fi
fi
cuda_lib=""
if [ ! -x "$worker" ]; then
  missing+=("no CUDA build ($worker is not built)")
else
  libs=$(timeout --foreground 30 ldd "$worker" 2>&1 || true)
  cuda_lib=$(grep -E 'lib(torch|c10)_cuda' <<<"$libs" | head -1 || true)
  if [ -z "$cuda_lib" ]; then
    torch_lib=$(grep -oE '/[^ ]*libtorch_cpu[^ ]*' <<<"$libs" | head -1 || true)
    if [ -n "$torch_lib" ]; then
      missing+=("no CUDA build ($worker links $torch_lib, a libtorch without CUDA)")
    else
      missing+=("no CUDA build (ldd $worker shows no libtorch_cuda, nor a libtorch it can load)")
    fi
  fi
fi
if [ "${#missing[@]}" -gt 0 ]; then
  reasons=${missing[0]}
  [ "${#missing[@]}" -gt 1 ] && reasons="${missing[0]} and ${missing[1]}"
  echo "bench/gpu_check.sh: nothing to check on this machine: $reasons; docs/OPERATIONS.md," \
       "\"Building the worker against CUDA libtorch\", says what a GPU run needs."
  exit 0
fi
if grep -q 'not found' <<<"$cuda_lib"; then
  echo "bench/gpu_check.sh: $worker links a CUDA libtorch the loader cannot find ($(xargs <<<"$cuda_lib")):" \
       "set LD_LIBRARY_PATH to its lib/ directory or rebuild" >&2
  exit 1
fi
# The coordinator and the CLI link no libtorch: build/'s serve when $bin has only the worker
# (docs/worker.md builds just dtrain-worker in build-cuda/).
coordinator=$bin/coordinator/dtrain-coordinator
dtrain=$bin/client/dtrain
[ -x "$coordinator" ] || coordinator=$root/build/coordinator/dtrain-coordinator
[ -x "$dtrain" ] || dtrain=$root/build/client/dtrain
for b in "$coordinator" "$dtrain"; do
  if [ ! -x "$b" ]; then
    echo "bench/gpu_check.sh: $b is not built: cmake --build $bin --target dtrain-coordinator dtrain" >&2
    exit 2
  fi
done
command -v python3 >/dev/null || { echo "bench/gpu_check.sh: needs python3" >&2; exit 2; }

# Runs a command under timeout in the background and waits for it: a signal to this script is
# then handled at once (bash holds traps while a foreground command runs), and cleanup stops it.
waiting="" running=""   # running: "JOB ADDRESS" while a job is watched
bounded() {  # seconds command...
  local rc=0
  timeout --foreground "$@" &
  waiting=$!
  wait "$waiting" || rc=$?
  waiting=""
  return "$rc"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
cleanup() {
  local status=$? kind
  trap - EXIT INT TERM
  if [ -n "$waiting" ]; then kill -TERM "$waiting" 2>/dev/null || true; wait "$waiting" 2>/dev/null || true; fi
  # A job still running is cancelled first: its workers then stop without draining it.
  if [ -n "$running" ]; then
    timeout 20 "$dtrain" cancel "${running% *}" --coordinator="${running#* }" >/dev/null 2>&1 || true
  fi
  for kind in gpu cpu; do
    [ -d "$work/$kind/cluster" ] || continue
    DTRAIN_LOCAL_DIR="$work/$kind/cluster" timeout --foreground 120 deploy/local/cluster.sh stop >/dev/null 2>&1 || true
  done
  if [ "$keep" = 1 ]; then echo "kept $work (cluster logs under */cluster/)" >&2; else rm -rf "$work"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# One directory of the three binaries, as deploy/local/cluster.sh takes them ($DTRAIN_BIN_DIR).
mkdir -p "$work/bin/coordinator" "$work/bin/worker" "$work/bin/client"
ln -s "$coordinator" "$work/bin/coordinator/dtrain-coordinator"
ln -s "$worker" "$work/bin/worker/dtrain-worker"
ln -s "$dtrain" "$work/bin/client/dtrain"
export DTRAIN_BIN_DIR=$work/bin

gpu_title="$ngpu visible GPU(s): $gpu_names${gpu_caps:+, compute capability $gpu_caps}"
echo "$gpu_title" >&2
echo "worker: $worker (CUDA libtorch: $(awk '{print $3}' <<<"$cuda_lib")); coordinator: $coordinator; CLI: $dtrain" >&2

# A local cluster of N workers (each told --devices=auto), its files under $work/KIND: the cpu
# one sees no GPU. Sets the variable VAR to its coordinator's address.
start_cluster() {  # gpu|cpu N VAR
  local kind=$1 n=$2 dir=$work/$1 hide=()
  mkdir -p "$dir/cache" "$dir/state"
  [ "$kind" = cpu ] && hide=(CUDA_VISIBLE_DEVICES=)
  if ! bounded 300 env ${hide[@]+"${hide[@]}"} DTRAIN_LOCAL_DIR="$dir/cluster" \
       CACHE_DIRECTORY="$dir/cache" STATE_DIRECTORY="$dir/state" \
       DTRAIN_WORKER_FLAGS="--devices=auto ${DTRAIN_WORKER_FLAGS:-}" \
       deploy/local/cluster.sh start --port 0 --workers "$n" >"$dir/start.log" 2>&1; then
    echo "bench/gpu_check.sh: the $kind cluster did not start:" >&2
    cat "$dir/start.log" >&2
    exit 1
  fi
  printf -v "$3" '127.0.0.1:%s' "$(cat "$dir/cluster/port")"
}

# The job spec of one case: the README demo's model and data, no validation or test (as
# bench/training.sh, so that samples/s is the training's).
write_spec() {  # name strategy devices num_nodes precision accelerator max_steps [ckpt_path]
  cat > "$work/$1.yaml" <<JOB
name: gpu-check-$1
model: {builtin: cnn}
data: {builtin: fashion-mnist, batch_size: $batch, shuffle: false}
trainer: {strategy: $2, devices: $3, num_nodes: $4, precision: $5, accelerator: $6,
          max_steps: $7, val_check_interval: 1000000000, skip_test: true}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
JOB
  if [ -n "${8:-}" ]; then echo "ckpt_path: $8" >> "$work/$1.yaml"; fi
}

# Submits $work/NAME.yaml to the coordinator at ADDRESS and waits for the job's end, at most
# --timeout seconds (then cancels it). Leaves NAME.id, NAME.status.json (its final status),
# NAME.log (its log), or NAME.error (why there is no job).
run_job() {  # address name
  local address=$1 name=$2 out id rc=0
  out=$(timeout --foreground 120 "$dtrain" fit --coordinator="$address" --output json --config "$work/$name.yaml" 2>&1) || rc=$?
  id=$(sed -n 's/^ *"id": "\([^"]*\)".*/\1/p' <<<"$out" | head -1)
  if [ -z "$id" ]; then
    # {"exit_code": 2, "error": {"code": ..., "message": ...}} (docs/jobs.md), else as it came.
    python3 -c 'import json, sys
try:
    print(json.loads(sys.argv[1])["error"]["message"])
except Exception:
    print(sys.argv[1].strip().splitlines()[-1] if sys.argv[1].strip() else "no output")' "$out" |
      sed "s/^/submit refused (exit $rc): /" > "$work/$name.error"
    return
  fi
  echo "$id" > "$work/$name.id"
  rc=0
  running="$id $address"
  bounded "$timeout_s" "$dtrain" watch "$id" --coordinator="$address" > "$work/$name.watch" 2>&1 || rc=$?
  running=""
  if [ "$rc" = 124 ]; then
    echo "timed out after ${timeout_s} s (cancelled)" > "$work/$name.error"
    timeout --foreground 30 "$dtrain" cancel "$id" --coordinator="$address" >/dev/null 2>&1 || true
  fi
  timeout --foreground 60 "$dtrain" status "$id" --coordinator="$address" --output json > "$work/$name.status.json" 2>&1 || true
  timeout --foreground 60 "$dtrain" logs "$id" --coordinator="$address" > "$work/$name.log" 2>&1 || true
}

# One row of the table for NAME, tab-separated: case, result, samples/s.
judge() {  # name label expected_step [resumed_at_step]
  python3 - "$work" "$1" "$2" "$3" "${4:-}" <<'PY'
import json, math, os, re, sys
work, name, label, expected, resumed_at = sys.argv[1:6]
def row(result, rate=""):
    result = " ".join(result.replace("|", "/").split())
    if len(result) > 240:
        result = result[:240].rsplit(" ", 1)[0] + " ..."
    print("\t".join([label, result, rate]))
    sys.exit(0)
error = os.path.join(work, name + ".error")
if os.path.exists(error) and not os.path.exists(os.path.join(work, name + ".status.json")):
    row("fail: " + open(error).read())
try:
    s = json.load(open(os.path.join(work, name + ".status.json")))
except ValueError:
    row("fail: no status: " + open(os.path.join(work, name + ".status.json")).read())
if "error" in s:
    row("fail: status: " + s["error"].get("message", ""))
p = s.get("progress", {})
rate = float(p.get("samples_per_second", 0))
shown = f"{rate:.0f}" if rate > 0 else ""
if os.path.exists(error):
    row("fail: " + open(error).read(), shown)
if s.get("state") != "SUCCEEDED":
    row(f"fail: {s.get('state', '?')}: {s.get('reason', '')}", shown)
step = int(p.get("global_step", 0))
if step != int(expected):
    row(f"fail: ended at step {step}, expected {expected}", shown)
loss = float(p.get("train_loss", "nan"))
if not math.isfinite(loss) or loss >= 2.0:
    row(f"fail: train_loss {loss:.3g} after {step} steps (not below 2.0)", shown)
if resumed_at:
    log = open(os.path.join(work, name + ".log")).read()
    if not re.search(r"resumed from \S+ at step " + resumed_at + r"\b", log):
        row(f"fail: its log does not say it resumed at step {resumed_at}", shown)
plane = p.get("collective_plane", "")
row(f"pass (train_loss {loss:.3f}" + (f", plane {plane}" if plane else "") + ")", shown)
PY
}

# The first job's last.ckpt, downloaded into $work/NAME/; prints its path, or nothing.
download_last() {  # address name
  local id
  id=$(cat "$work/$2.id" 2>/dev/null) || return 0
  timeout --foreground 120 "$dtrain" download "$id" last --coordinator="$1" --output json -o "$work/$2" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["files"][0]["path"])' 2>/dev/null || true
}

# A checkpoint round trip: NAME-a trains half the steps on FROM's cluster, NAME-b resumes from
# its last.ckpt on TO's cluster and trains the other half. One row: the resumed job's.
round_trip() {  # name label from_address from_accelerator to_address to_accelerator
  local name=$1 label=$2 half=$(( steps / 2 > 0 ? steps / 2 : 1 )) first ckpt
  write_spec "$name-a" single_device 1 1 32-true "$4" "$half"
  run_job "$3" "$name-a"
  first=$(judge "$name-a" "$label" "$half" | cut -f2)
  if [[ $first != pass* ]]; then
    printf '%s\tfail: its first job (%s): %s\t\n' "$label" "$4" "${first#fail: }"
    return
  fi
  ckpt=$(download_last "$3" "$name-a")
  if [ -z "$ckpt" ] || [ ! -s "$ckpt" ]; then
    printf '%s\tfail: the first job'"'"'s last.ckpt could not be downloaded\t\n' "$label"
    return
  fi
  write_spec "$name-b" single_device 1 1 32-true "$6" $(( 2 * half )) "$ckpt"
  run_job "$5" "$name-b"
  judge "$name-b" "$label" $(( 2 * half )) "$half"
}

: > "$work/rows.tsv"
echo "starting a cluster of $ngpu GPU worker(s) and one CPU-only worker ..." >&2
gpu="" cpu=""
start_cluster gpu "$ngpu" gpu
start_cluster cpu 1 cpu

echo "single_device ..." >&2
write_spec single single_device 1 1 32-true "$accel" "$steps"
run_job "$gpu" single; judge single "single_device" "$steps" >> "$work/rows.tsv"

echo "ddp over $ngpu GPU(s) ..." >&2
write_spec ddp ddp 1 "$ngpu" 32-true "$accel" "$steps"
run_job "$gpu" ddp; judge ddp "ddp x$ngpu" "$steps" >> "$work/rows.tsv"

echo "dp over $ngpu GPU(s) ..." >&2
write_spec dp dp "$ngpu" 1 32-true "$accel" "$steps"
run_job "$gpu" dp; judge dp "dp x$ngpu" "$steps" >> "$work/rows.tsv"

for precision in 16-mixed bf16-mixed; do
  echo "$precision ..." >&2
  write_spec "$precision" single_device 1 1 "$precision" "$accel" "$steps"
  run_job "$gpu" "$precision"; judge "$precision" "$precision" "$steps" >> "$work/rows.tsv"
done

echo "checkpoint GPU -> CPU ..." >&2
round_trip gpu2cpu "ckpt gpu->cpu" "$gpu" "$accel" "$cpu" cpu >> "$work/rows.tsv"
echo "checkpoint CPU -> GPU ..." >&2
round_trip cpu2gpu "ckpt cpu->gpu" "$cpu" cpu "$gpu" "$accel" >> "$work/rows.tsv"

echo
echo "dtrain GPU check, $(date -u +%Y-%m-%dT%H:%MZ): $gpu_title; $steps steps of $batch per rank"
echo
echo "| case | result | samples/s |"
echo "| --- | --- | --- |"
failed=0
while IFS=$'\t' read -r label result rate; do
  echo "| $label | $result | ${rate:--} |"
  [[ $result == pass* ]] || failed=1
done < "$work/rows.tsv"
if [ "$failed" = 1 ]; then
  heading="The end of each failed job's log (--keep keeps the workers' logs too):"
  for log in "$work"/*.log; do
    [ -e "$log" ] || continue
    name=$(basename "$log" .log)
    grep -q '"state": "SUCCEEDED"' "$work/$name.status.json" 2>/dev/null && continue
    [ -n "$heading" ] && printf '\n%s\n' "$heading" && heading=""
    echo "--- $name ($(cat "$work/$name.id" 2>/dev/null))"
    tail -n 8 "$log"
  done
  exit 1
fi

#!/usr/bin/env bash
# Streaming memory bench (issue 36, items 3 and 4): a worker streams a sharded dataset with memory
# that does not grow with the dataset, and trains from more data than its memory limit.
#
#   bench/data_memory.sh               peak RSS of ONE worker training one epoch from a small set
#                                      and from a set of 10x its shards (same shard size), for
#                                      data.num_workers 2 (the default), 0 and 4; target: the 10x
#                                      set's peak within 10% of the small set's (ratio <= 1.10)
#   bench/data_memory.sh --cgroup      the worker in a memory cgroup limited to 1 GiB trains from
#                                      a 4 GiB set: the job succeeds, the worker's peak RSS and the
#                                      group's peak stay under the limit, no OOM kill
#     [--limit_mib N]                  another limit
#     [--shuffle_buffer N]             data.shards.shuffle_buffer (default 256: 256 MiB of these
#                                      samples; 1000, the spec's default, needs more than 1 GiB)
#   --epochs N                         train N epochs instead of 1 (memory must not grow with
#                                      the samples streamed either)
#   --keep                             leave the work directory (logs, specs) in /tmp
# Exits 1 when a target is missed (a row marked NO, or FAIL).
#
# Each measurement runs a fresh dtrain-worker (one rank, one compute thread, single_device), so
# its peak RSS (VmHWM in /proc/<pid>/status, read just before it is stopped) is that job's alone.
# The coordinator is our own, on 127.0.0.1 with a free port. Binaries come from
# $DTRAIN_BIN_DIR (default: build/, built here if unset). Shard sets are written once by
# bench/make_shards.py under $DTRAIN_BENCH_DATA (default /tmp/dtrain-bench-data) and reused.
#
# cgroup: v2 when the unified hierarchy has the memory controller (memory.max, memory.peak,
# memory.events), else v1's memory controller (memory.limit_in_bytes, memory.max_usage_in_bytes,
# memory.failcnt, memory.oom_control). Needs root (or a delegated group). The group is a child
# of this shell's own group (v2: of the hierarchy's root when ours cannot have one) and is
# removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=rss; limit_mib=1024; keep=0; cgroup_shuffle=256; epochs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cgroup) mode=cgroup ;;
    --limit_mib) limit_mib=$2; shift ;;
    --shuffle_buffer) cgroup_shuffle=$2; shift ;;
    --keep) keep=1 ;;
    --epochs) epochs=$2; shift ;;
    *)
      echo "usage: bench/data_memory.sh [--cgroup [--limit_mib N] [--shuffle_buffer N]]" \
        "[--epochs N] [--keep]" >&2
      exit 2 ;;
  esac
  shift
done

if [ -z "${DTRAIN_BIN_DIR:-}" ]; then
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_BUILD_WORKER=ON >&2
  fi
  cmake --build build --target dtrain-coordinator dtrain-worker dtrain >&2
fi
bin=${DTRAIN_BIN_DIR:-$root/build}
data=${DTRAIN_BENCH_DATA:-/tmp/dtrain-bench-data}
mkdir -p "$data"

work=$(mktemp -d /tmp/dtrain-membench.XXXXXX)
coordinator_pid="" worker_pid="" sampler_pid="" group=""
cleanup() {
  local rc=$? pid
  for pid in "$sampler_pid" "$worker_pid" "$coordinator_pid"; do
    [ -n "$pid" ] || continue
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$group" ] && [ -d "$group" ]; then rmdir "$group" 2>/dev/null || true; fi
  if [ "$keep" = 1 ]; then echo "work directory kept: $work" >&2; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- shard sets ------------------------------------------------------------------------------
# Bytes a set takes: per sample its .npy (3,264 B), .cls and padding, each with a 512-byte tar
# header and padded to 512 bytes.
set_bytes() {  # shards per_shard pad_kb
  echo $(( $1 * $2 * ($3 * 1024 + 3584 + 1024 + 1024) + $1 * 10240 ))
}

# Writes the set once; reused when its list file (written last) is there. Prints its directory.
make_set() {  # name shards per_shard pad_kb
  local dir="$data/$1-${2}x${3}-pad${4}k"
  if [ ! -s "$dir/train.txt" ]; then
    local need avail
    need=$(set_bytes "$2" "$3" "$4")
    avail=$(df -B1 --output=avail "$data" | tail -1)
    # Keep 1 GiB free besides the set (other users of this disk).
    if [ "$avail" -lt $(( need + (1 << 30) )) ]; then
      echo "not enough disk for the '$1' set: it needs $(( need >> 20 )) MiB (+1 GiB to spare) in" \
        "$data, which has $(( avail >> 20 )) MiB free; set DTRAIN_BENCH_DATA to a larger disk" >&2
      exit 1
    fi
    echo "writing the '$1' set ($2 shards x $3 samples, ${4} KiB padding each," \
      "~$(( need >> 20 )) MiB) in $dir" >&2
    /usr/bin/python3 bench/make_shards.py "$dir" --shards "$2" --per_shard "$3" --pad_kb "$4" >&2
  fi
  echo "$dir"
}

# ---- processes -------------------------------------------------------------------------------
wait_file() {  # file what pid
  for _ in $(seq 300); do
    [ -s "$1" ] && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.1
  done
  echo "$2 did not start; its log:" >&2
  cat "$work/$2.log" >&2
  exit 1
}

"$bin/coordinator/dtrain-coordinator" --listen=127.0.0.1:0 --port_file="$work/coordinator.port" \
  --state_dir="$work/state" >"$work/coordinator.log" 2>&1 &
coordinator_pid=$!
wait_file "$work/coordinator.port" coordinator "$coordinator_pid"
address="127.0.0.1:$(cat "$work/coordinator.port")"
dtrain() { "$bin/client/dtrain" --coordinator="$address" "$@"; }

# Starts a worker (in $group when set), waits until the coordinator lists it idle.
start_worker() {  # name
  rm -f "$work/$1.port"
  local args=(--coordinator="$address" --listen=127.0.0.1:0 --port_file="$work/$1.port"
              --name="$1" --threads=1 --cache_dir="$work/cache-$1" --jobs_dir="$work/jobs-$1")
  if [ -n "$group" ]; then
    # The shell joins the group and becomes the worker: nothing runs outside the limit.
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$group" "$bin/worker/dtrain-worker" \
      "${args[@]}" >"$work/$1.log" 2>&1 &
  else
    "$bin/worker/dtrain-worker" "${args[@]}" >"$work/$1.log" 2>&1 &
  fi
  worker_pid=$!
  wait_file "$work/$1.port" "$1" "$worker_pid"
  for _ in $(seq 100); do
    dtrain workers 2>/dev/null | grep -q "$1" && return 0
    sleep 0.1
  done
  echo "worker $1 did not register; its log:" >&2; cat "$work/$1.log" >&2; exit 1
}

# SIGTERM, up to 20 s for a clean exit, then SIGKILL.
stop_worker() {
  kill -TERM "$worker_pid" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$worker_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$worker_pid" 2>/dev/null || true
  wait "$worker_pid" 2>/dev/null || true
  worker_pid=""
}

kib_mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }

status_kib() {  # pid field
  awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"
}

# $epochs epochs of the MLP from a set's list file on one worker; prints the fit's seconds.
run_job() {  # name set_dir num_workers shuffle_buffer
  cat >"$work/$1.yaml" <<EOF
name: $1
model: {builtin: mlp}
data:
  shards:
    train: "worker:$2/train.txt"
    fields: [{name: npy}, {name: cls, type: int}]
    shuffle_buffer: $4
  batch_size: 32
  num_workers: $3
trainer:
  max_epochs: $epochs
  strategy: single_device
  num_nodes: 1
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
EOF
  local start end
  start=$(date +%s.%N)
  if ! timeout 1800 "$bin/client/dtrain" --coordinator="$address" fit --wait \
      --config "$work/$1.yaml" >"$work/$1.fit.log" 2>&1 ||
      ! grep -q "SUCCEEDED" "$work/$1.fit.log"; then
    echo "job $1 did not succeed:" >&2
    cat "$work/$1.fit.log" >&2
    tail -20 "$work/$1.log" >&2 || true
    return 1
  fi
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}'
}

set_samples() {
  awk '{for (i = 2; i <= NF; ++i) if ($i ~ /^samples:/) {sub("samples:", "", $i); n += $i}}
       END {print n}' "$1/train.txt"
}
set_shards() { grep -c '\.tar' "$1/train.txt"; }
set_gib() { du -cb "$1"/*.tar | tail -1 | awk '{printf "%.2f", $1 / 2^30}'; }

# ---- RSS: small versus 10x -------------------------------------------------------------------
if [ "$mode" = rss ]; then
  # ~20 KiB per sample (a 28x28 float .npy, a label, 16 KiB padding every rank reads): a leak of
  # raw sample bytes would show as 10x the set's size; the window's 64 samples are ~1.3 MiB and
  # the shuffle buffer's 1,000 ~21 MiB.
  small=$(make_set small 10 400 16)
  big=$(make_set small10x 100 400 16)
  shuffle=1000  # data.shards.shuffle_buffer's default
  printf '%-6s %11s %6s %7s %5s %7s %8s %8s %8s %14s %6s\n' set num_workers shards samples GiB \
    seconds idle_MiB peak_MiB job_MiB peak_to_small within | tee "$work/table"
  for nw in 2 0 4; do
    base=""
    for which in small 10x; do
      dir=$small; [ "$which" = 10x ] && dir=$big
      name="mem-$which-nw$nw"
      start_worker "$name"
      idle=$(status_kib "$worker_pid" VmRSS)
      seconds=$(run_job "$name" "$dir" "$nw" "$shuffle")
      hwm=$(status_kib "$worker_pid" VmHWM)
      stop_worker
      [ -z "$base" ] && base=$hwm
      ratio=$(awk -v a="$hwm" -v b="$base" 'BEGIN {printf "%.3f", a / b}')
      within=$(awk -v r="$ratio" 'BEGIN {print (r <= 1.10) ? "yes" : "NO"}')
      [ "$which" = small ] && within="-"
      printf '%-6s %11s %6s %7s %5s %7s %8s %8s %8s %14s %6s\n' "$which" "$nw" \
        "$(set_shards "$dir")" "$(set_samples "$dir")" "$(set_gib "$dir")" "$seconds" \
        "$(kib_mib "$idle")" "$(kib_mib "$hwm")" "$(kib_mib $(( hwm - idle )))" "$ratio" "$within" |
        tee -a "$work/table"
    done
  done
  echo "$epochs epoch(s) of the MLP, batch 32, prefetch_batches 2, shuffle_buffer $shuffle," \
    "one rank;"
  echo "idle: the worker's VmRSS before the job; peak: its VmHWM just before it stopped; job: peak"
  echo "- idle (what the job added); target: the 10x set's peak within 1.10 of the small set's"
  if grep -q ' NO$' "$work/table"; then exit 1; fi
  exit 0
fi

# ---- cgroup: 4 GiB through a 1 GiB limit -----------------------------------------------------
# 64 shards x 64 samples of ~1 MiB (1 MiB padding each): 4 GiB, 4 x the limit.
big=$(make_set 4gib 64 64 1024)
shuffle=$cgroup_shuffle  # x ~1 MiB raw samples (docs/data.md's Memory)
limit=$(( limit_mib << 20 ))

v2_mount=""
for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do
  if grep -qw memory "$m/cgroup.controllers" 2>/dev/null; then v2_mount=$m; break; fi
done
if [ -n "$v2_mount" ]; then
  version=v2
  own="$v2_mount$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)"
  own=${own%/}
  # A v2 group hands the memory controller to its children only when it has no processes of its
  # own (the root excepted): our own group when it is delegated with memory enabled already,
  # else the hierarchy's root (root user), else our own group if it lets us enable it.
  base=""
  for parent in "$own" "$v2_mount"; do
    if grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null && [ -w "$parent" ]; then
      base=$parent; break
    fi
  done
  if [ -z "$base" ]; then
    if echo +memory >"$own/cgroup.subtree_control" 2>/dev/null; then
      base=$own
    else
      echo "cannot get a cgroup v2 group with the memory controller: neither $own nor" \
        "$v2_mount hands it to children we may create; run as root, or under" \
        "systemd-run --user --scope -p Delegate=yes" >&2
      exit 1
    fi
  fi
elif [ -d /sys/fs/cgroup/memory ]; then
  version=v1
  base="/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)"
  base=${base%/}
else
  echo "no cgroup memory controller here (neither v2's memory.max nor v1's memory" \
    "controller under /sys/fs/cgroup)" >&2
  exit 1
fi
if ! mkdir "$base/dtrain-membench-$$" 2>"$work/mkdir.err"; then
  echo "cannot create a memory cgroup under $base ($(cat "$work/mkdir.err")); run as root or" \
    "in a delegated cgroup" >&2
  exit 1
fi
group="$base/dtrain-membench-$$"
if [ "$version" = v2 ]; then
  echo "$limit" >"$group/memory.max"
  echo 0 2>/dev/null >"$group/memory.swap.max" || true
  peak_file="$group/memory.peak"  # Linux >= 5.19; else the sampled peak of memory.current
  usage_file="$group/memory.current"
else
  echo "$limit" >"$group/memory.limit_in_bytes"
  # With swap, memory+swap too, so the worker cannot page out past the limit. Not without:
  # measured here (no swap), with memsw set both failcnts stayed 0 at the limit.
  if [ "$(awk '$1 == "SwapTotal:" {print $2}' /proc/meminfo)" != 0 ]; then
    echo "$limit" 2>/dev/null >"$group/memory.memsw.limit_in_bytes" || true
  fi
  peak_file="$group/memory.max_usage_in_bytes"
  usage_file="$group/memory.usage_in_bytes"
fi

# The page cache is charged to the group that first reads a page: drop this set's cached pages
# (per file, nothing else's) so the worker's own reads are charged to its group.
for f in "$big"/*.tar; do dd if="$f" iflag=nocache count=0 status=none 2>/dev/null || true; done

# The group's anonymous memory (what the worker allocates; the peak counts page cache too),
# sampled every 100 ms while the worker runs.
anon_sampler() {
  local key=total_rss max=0 usage_max=0 v
  [ "$version" = v2 ] && key=anon
  while kill -0 "$1" 2>/dev/null; do
    v=$(awk -v k="$key" '$1 == k {print $2}' "$group/memory.stat" 2>/dev/null || echo 0)
    [ -n "$v" ] && [ "$v" -gt "$max" ] && max=$v && echo "$max" >"$work/anon_peak"
    v=$(cat "$usage_file" 2>/dev/null || echo 0)
    [ "$v" -gt "$usage_max" ] && usage_max=$v && echo "$usage_max" >"$work/usage_peak"
    sleep 0.1
  done
}

echo 0 >"$work/anon_peak"; echo 0 >"$work/usage_peak"
start_worker mem-cgroup
idle=$(status_kib "$worker_pid" VmRSS)
anon_sampler "$worker_pid" &
sampler_pid=$!
state=FAILED
if seconds=$(run_job mem-cgroup "$big" 2 "$shuffle"); then state=SUCCEEDED; else seconds=-; fi
hwm=""
[ -n "$worker_pid" ] && kill -0 "$worker_pid" 2>/dev/null && hwm=$(status_kib "$worker_pid" VmHWM)
peak=$(cat "$peak_file" 2>/dev/null || cat "$work/usage_peak")
if [ "$version" = v2 ]; then
  ooms=$(awk '$1 == "oom_kill" {print $2}' "$group/memory.events")
  hits=$(awk '$1 == "max" {print $2}' "$group/memory.events")
  hits_name="memory.events max"
else
  ooms=$(awk '$1 == "oom_kill" {print $2}' "$group/memory.oom_control")
  hits=$(cat "$group/memory.failcnt")
  hits=$(( hits + $(cat "$group/memory.memsw.failcnt" 2>/dev/null || echo 0) ))
  hits_name="memory.failcnt + memory.memsw.failcnt"
fi
[ -n "$worker_pid" ] && stop_worker
kill "$sampler_pid" 2>/dev/null || true
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=""
anon=$(cat "$work/anon_peak")
rmdir "$group" && group=""

# docs/data.md's Memory: the shuffle buffer, the window (max(prefetch_batches x batch,
# 2 x num_workers)), one sample per decoding thread and the one the reader holds, raw.
sample_bytes=$(( $(du -cb "$big"/*.tar | tail -1 | cut -f1) / $(set_samples "$big") ))
rule=$(( (shuffle + 64 + 2 + 1) * sample_bytes ))
mib() { awk -v b="$1" 'BEGIN {if (b == "") print "-"; else printf "%.1f", b / 2^20}'; }
hwm_bytes=""; [ -n "$hwm" ] && hwm_bytes=$(( hwm * 1024 ))
echo "cgroup $version memory controller, limit $limit_mib MiB; set: $(set_shards "$big") shards," \
  "$(set_samples "$big") samples, $(set_gib "$big") GiB; $epochs epoch(s), data.num_workers 2," \
  "shuffle_buffer $shuffle, batch 32"
printf '%-34s %12s %12s\n' measure MiB of_limit
row() { printf '%-34s %12s %12s\n' "$1" "$(mib "$2")" \
  "$(awk -v b="$2" -v l="$limit" 'BEGIN {if (b == "") print "-"; else printf "%.2f", b / l}')"; }
row "worker idle RSS (before the job)" $(( idle * 1024 ))
row "worker peak RSS (VmHWM)" "$hwm_bytes"
[ -n "$hwm_bytes" ] && row "  the job's (peak - idle)" $(( hwm_bytes - idle * 1024 ))
row "  the rule's raw samples (bound)" "$rule"
row "group peak (incl. page cache)" "$peak"
row "group anon peak (sampled 100ms)" "$anon"
echo "job: $state in $seconds s; OOM kills: ${ooms:-?}; times at the limit ($hits_name): ${hits:-?}"
echo "The group's peak counts the page cache of the shards it read: the kernel fills the group"
echo "up to the limit with cache and reclaims it there (the times at the limit), which is not"
echo "a shortage; the worker's own memory is its RSS and the group's anonymous memory."
ok=1
[ "$state" = SUCCEEDED ] || ok=0
[ -n "$hwm_bytes" ] && [ "$hwm_bytes" -lt "$limit" ] || ok=0
[ -n "$peak" ] && [ "$peak" -le "$limit" ] || ok=0
[ "${ooms:-1}" = 0 ] || ok=0
if [ "$ok" = 1 ]; then
  echo "PASS: succeeded, under the limit, no OOM kill"
else
  echo "FAIL"
  exit 1
fi

# Sourced by bench/training.sh and bench/demo.sh: the compute ceiling of a 2-rank ddp job, i.e.
# two plain libtorch processes (bench/train_loop_bench.cc) started together, pinned to the cores
# the local cluster gives its workers, each computing the whole job with no communication: every
# rank's batch on its own replica of the model, the replicas' mean gradient, every replica's
# update (--all_ranks). So the ceiling trains the model the job trains. Loops that each trained
# their own model on half the data did not: on the CNN their max-pooling is cheaper per sample
# than a ddp job's (docs/BENCHMARKS.md, "The ceiling trains the job's model"), and
# own_ceiling_once still measures them, for comparison with earlier tables.
# The processes' joint rate is all samples / (last end - first start), the span dtrain's train
# timer covers. Each process is warmed first by 5 steps of a throwaway model, as a worker daemon
# is warm from its earlier jobs. Each rank's part of each step is timed, so that the row also
# says what a synchronous run (ranks waiting for each other every step, as ddp's all-reduce
# makes them) could keep of it with a free, instant all-reduce: rank skew's share.
#
# ceiling_once BUILD_DIR WORK_DIR MODEL BATCH STEPS RUN [loop flags...]
# prints one JSON row {system: compute-ceiling, model, ranks, batch, run, samples_per_s,
# barrier_s and core_wait_share (lockstep only: the longer of the ranks' waits at the barrier,
# the larger rank's share of its span ready to run while other threads held its core),
# synchronous_share}; $pins (an array, as `deploy/local/cluster.sh cpus --workers 2` prints)
# gives each loop its cores. Loop flags such as --epochs and --cosine give the job's length and
# schedule.
# Since 2026-12-05 the ceiling and the lockstep loops take --split_step: a ddp job on shm splits
# its optimizer step between its ranks by default (trainer.split_optimizer_step), so the job does
# one update, not one per rank, and so do they (the ceiling updates one replica and copies it into
# the other; the lockstep loops each step their part inside the all-reduce, as the plane does).
ceiling_once() { loops_once compute-ceiling "$@" --all_ranks --split_step; }

# own_ceiling_once BUILD_DIR WORK_DIR MODEL BATCH STEPS RUN [loop flags...]
# The ceiling as measured until 2026-11-30: each process one rank's batches on its own model
# (no averaging), so each trains a different model from the job's; since 2026-12-01 on the job's
# batches (it read other samples before). Prints {system: own-model-ceiling, ...}.
own_ceiling_once() { loops_once own-model-ceiling "$@"; }

# loops_once SYSTEM BUILD_DIR WORK_DIR MODEL BATCH STEPS RUN [loop flags...]: the two processes,
# as one row labelled SYSTEM (a lockstep-ceiling row gives its barrier time, the others their
# synchronous share).
loops_once() {
  local system=$1 build=$2 work=$3 model=$4 batch=$5 steps=$6 run=$7 at i pids=()
  shift 7
  # After data loading and the warm steps (~1.5 s for the CNN when idle).
  at=$(/usr/bin/python3 -c 'import time; print(f"{time.time() + 4:.3f}")')
  for i in 0 1; do
    "$build/bench/dtrain-bench-train-loop" --model "$model" --batch "$batch" --threads 1 \
      --warm_process 5 --warmup 0 --rank $i --world_size 2 --start_at "$at" \
      --steps "$steps" --step_times "$work/ceiling-steps-$i.txt" \
      ${pins[$i]:+--cpus="${pins[$i]}"} "$@" > "$work/ceiling-$i.json" &
    pids+=($!)
  done
  # Both ranks or no row: one rank's samples over the span would pass for a slow ceiling.
  # A failed rank's peer is stopped, not left computing under the next measurement.
  for i in 0 1; do
    wait "${pids[$i]}" || {
      kill "${pids[@]}" 2>/dev/null || true
      echo "ceiling: rank $i of the $model loops failed (above)" >&2
      return 1
    }
  done
  cat "$work/ceiling-0.json" "$work/ceiling-1.json" | /usr/bin/python3 -c "
import json, os, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
assert len(rows) == 2, 'ceiling: expected a row from each of the 2 loops'
span = max(r['end'] for r in rows) - min(r['start'] for r in rows)
row = {'system': '$system', 'model': '$model', 'ranks': 2, 'batch': $batch, 'run': $run,
       'samples_per_s': round(sum(r['samples'] for r in rows) / span, 1)}
if row['system'] != 'own-model-ceiling':
    # Both kinds train the job's model, bit for bit: the ceiling's processes each compute it
    # whole, the lockstep loops average into it. So their parameters must end the same in both
    # processes, and the lockstep loops' the same as the ceiling's (kept from its last sample,
    # which every caller takes with the same steps and flags): else a reference is broken.
    sums = [r['parameters_sum'] for r in rows]
    if sums[0] != sums[1]:
        sys.exit(f'ceiling: the two $system loops of the $model ended on different parameters '
                 f'(sums {sums[0]} and {sums[1]}): their averaging is broken')
    row['parameters_sum'] = sums[0]
    kept = '$work/ceiling-parameters-$model'
    if row['system'] == 'compute-ceiling':
        with open(kept, 'w') as f:
            f.write(repr(sums[0]))
    elif os.path.exists(kept) and float(open(kept).read()) != sums[0]:
        sys.exit(f'ceiling: the $model lockstep loops ended on parameters summing to {sums[0]}, '
                 f'the ceiling on {open(kept).read()}: they trained different models')
if row['system'] == 'lockstep-ceiling':
    row['barrier_s'] = max(r['barrier_s'] for r in rows)
    # Each rank's mean step by phase (ms: data, forward, backward, averaging, optimizer), to set
    # beside a job's time per batch by rank.
    row['phases_ms'] = [r.get('phases_ms') for r in rows]
    # The larger rank's share of its timed span spent ready to run while other threads held its
    # core (a job's log gives the same per rank); absent where the kernel does not say.
    waits = [r['core_wait_s'] / (r['end'] - r['start']) for r in rows
             if r.get('core_wait_s', -1) >= 0 and r['end'] > r['start']]
    if len(waits) == 2:
        row['core_wait_share'] = round(max(waits), 5)
else:
    a, b = ([[float(x) for x in l.split()] for l in open(f'$work/ceiling-steps-{i}.txt')] for i in (0, 1))
    if len(a[0]) > 1:
        # --all_ranks: each process timed every rank's part of each step on its one core, so this
        # share is the batches' skew alone (one core drifting against the other is not in it: the
        # lockstep sample measures that); a synchronous run waits for the slowest part each step
        # (the two processes' estimates averaged).
        share = sum(max(sum(r) for r in zip(*p)) / sum(max(s) for s in p) for p in (a, b)) / 2
    else:
        a, b = [x[0] for x in a], [x[0] for x in b]
        share = max(sum(a), sum(b)) / sum(max(x, y) for x, y in zip(a, b))
    row['synchronous_share'] = round(share, 4)
print(json.dumps(row))"
}

# lockstep_once BUILD_DIR WORK_DIR MODEL BATCH STEPS RUN [loop flags...]
# Two loops each doing one rank's batches, meeting every step in a file they share
# (--lockstep) where they average their gradients before the update (--average_gradients: the
# shm plane's in-place all-reduce of a ddp bucket, its kernel and its two barriers; the
# gradients live in the file; with the split step of a job on shm, --split_step, the parameters
# too): a ddp job with dtrain's own all-reduce and no service, measured
# rather than estimated from timed steps. It pays what ranks stepping together really
# pay on this machine (waiting for the slower rank, moving the gradients between the cores).
# Prints one row {system: lockstep-ceiling, ...}.
lockstep_once() {
  # In /dev/shm, not the work directory: a shared mapping of a disk file is written back every
  # few seconds, and the next write to a page faults inside a timed step.
  local barrier="/dev/shm/dtrain-lockstep-$$" status=0
  rm -f "$barrier"
  # The file goes whether the loops succeed or not (a failure must not leave it in memory).
  loops_once lockstep-ceiling "$@" --lockstep="$barrier" --average_gradients --split_step ||
    status=$?
  rm -f "$barrier"
  return "$status"
}

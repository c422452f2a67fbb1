#!/usr/bin/env bash
# Fuzzes the decoders that face the network and the user, for a bounded time each:
#   tests/fuzz/run.sh [--seconds N] [--torch] [TARGET...]   (default 60 s per target, all)
# --torch adds the libtorch targets (torch_save, checkpoint_restore, optimization_recipe), whose
# first build compiles the worker's model and checkpoint libraries with clang and the sanitizers
# (about 15 minutes on 2 cores).
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/, starts from the seed
# corpus in tests/fuzz/corpus/<target>/ plus what earlier runs kept in build-fuzz/corpus/, and
# prints each target's executions and findings. Crash inputs land in build-fuzz/findings/.
# Exit status: 0 when no target found anything. Not part of tests/run.sh (its time is unbounded
# by nature); record notable runs in docs/FUZZING.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=60
torch=OFF
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --torch) torch=ON; shift ;;
    -*) echo "usage: tests/fuzz/run.sh [--seconds N] [--torch] [TARGET...]" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=(tensor_wire job_spec hparams shard_list schedstat packed_results reflection_request \
    csv_line metrics_csv cpu_list tar_shard npy text_fields image_decode plain_png idx \
    pickle_check http_request)
  if [ "$torch" = ON ]; then targets+=(torch_save checkpoint_restore optimization_recipe); fi
fi
for t in "${targets[@]}"; do
  case "$t" in torch_save|checkpoint_restore|optimization_recipe) torch=ON ;; esac
done
deploy/install-deps.sh --fuzz >&2
build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDTRAIN_BUILD_WORKER=$torch -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_FUZZERS=ON >&2
cmake --build "$build" --target "${targets[@]/%/_fuzzer}" >&2
status=0
for target in "${targets[@]}"; do
  mkdir -p "$build/corpus/$target" "$build/findings/$target"
  log="$build/$target.log"
  echo "fuzzing $target for ${seconds}s ..." >&2
  set +e
  # libtorch 1.13 leaks a few hundred bytes inside itself (miniz's reallocs, no dtrain frame)
  # on some malformed archives: recorded in docs/FUZZING.md; its targets run without LeakSanitizer
  # so that the fuzzing goes on past it.
  leaks=1
  case "$target" in torch_save|checkpoint_restore) leaks=0 ;; esac
  # LeakSanitizer still reports at exit, and libFuzzer then saves the empty input it was on: for
  # these targets that is libtorch's leak above, not a finding, when no other error is logged
  # and no dtrain frame is in any leak's stack. A file of an earlier run must not be taken for it.
  empty="$build/findings/$target/crash-da39a3ee5e6b4b0d3255bfef95601890afd80709"
  [ "$leaks" = 1 ] || rm -f "$empty"
  "$build/tests/fuzz/${target}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -detect_leaks=$leaks \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$build/findings/$target/" \
    "$build/corpus/$target" "tests/fuzz/corpus/$target" >"$log" 2>&1
  code=$?
  set -e
  if [ "$leaks" = 0 ] && [ "$code" != 0 ] && [ -e "$empty" ] && [ ! -s "$empty" ] &&
     ! grep -q -E "ERROR: AddressSanitizer|runtime error:|deadly signal|uncaught" "$log" &&
     ! grep -q " in dtrain::" "$log" && grep -q "ERROR: LeakSanitizer" "$log"; then
    rm -f "$empty"
    code=0
    echo "$target: libtorch's leak at exit: $(grep -m1 '^SUMMARY: AddressSanitizer' "$log")" >&2
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  findings=$(find "$build/findings/$target" -type f | wc -l)
  corpus=$(find "$build/corpus/$target" -type f | wc -l)
  echo "$target: ${execs:-?} executions in ${seconds}s, corpus $corpus inputs, findings $findings (exit $code; log $log)"
  # UBSan reports and goes on (the build does not make it fatal): its reports are findings too.
  ub=$(grep -c "runtime error:" "$log" || true)
  if [ "$ub" != 0 ]; then echo "$target: $ub undefined-behaviour report(s) in $log" >&2; fi
  if [ "$code" != 0 ] || [ "$findings" != 0 ] || [ "$ub" != 0 ]; then
    status=1
    grep -m5 -E "ERROR|SUMMARY|abort|runtime error:" "$log" || true
  fi
done
exit $status

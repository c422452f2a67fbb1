#!/usr/bin/env bash
# Fuzzes the decoders that face the network and the user, for a bounded time each:
#   tests/fuzz/run.sh [--seconds N]      (default 60 per target)
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/, starts from the seed
# corpus in tests/fuzz/corpus/<target>/ plus what earlier runs kept in build-fuzz/corpus/, and
# prints each target's executions and findings. Crash inputs land in build-fuzz/findings/.
# Exit status: 0 when no target found anything. Not part of tests/run.sh (its time is unbounded
# by nature); record notable runs in docs/FUZZING.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=60
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    *) echo "usage: tests/fuzz/run.sh [--seconds N]" >&2; exit 2 ;;
  esac
done
deploy/install-deps.sh --fuzz >&2
build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDTRAIN_BUILD_WORKER=OFF -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_FUZZERS=ON >&2
cmake --build "$build" --target tensor_wire_fuzzer job_spec_fuzzer shard_list_fuzzer tar_shard_fuzzer \
  npy_fuzzer text_fields_fuzzer image_decode_fuzzer idx_fuzzer \
  pickle_check_fuzzer >&2
status=0
for target in tensor_wire job_spec shard_list tar_shard npy text_fields image_decode idx \
  pickle_check; do
  mkdir -p "$build/corpus/$target" "$build/findings/$target"
  log="$build/$target.log"
  echo "fuzzing $target for ${seconds}s ..." >&2
  set +e
  "$build/tests/fuzz/${target}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$build/findings/$target/" \
    "$build/corpus/$target" "tests/fuzz/corpus/$target" >"$log" 2>&1
  code=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  findings=$(find "$build/findings/$target" -type f | wc -l)
  corpus=$(find "$build/corpus/$target" -type f | wc -l)
  echo "$target: ${execs:-?} executions in ${seconds}s, corpus $corpus inputs, findings $findings (exit $code; log $log)"
  if [ "$code" != 0 ] || [ "$findings" != 0 ]; then status=1; grep -m5 -E "ERROR|SUMMARY|abort" "$log" || true; fi
done
exit $status

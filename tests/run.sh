#!/usr/bin/env bash
# The test command: installs dependencies (idempotent), checks formatting, that the docs name
# only what exists, the worker's layering (tests/check_layering.py) and that commit subjects
# fit 72 characters, builds with -Werror, runs ctest, and beside it (in the idle scheduling
# class) clang's thread-safety analysis over common/, coordinator/, client/ and worker/ and the
# benchmarks' build.
# The tests labelled `load` (64 ranks in one group; a 1 GiB all_reduce) run alone after the
# others, so their CPU load cannot starve the others' timing-sensitive liveness checks on a
# 2-core machine.
# A skipped test is a failure unless tests/allowed_skips.txt allows it with its reason
# (tests/check_skips.py, from ctest's results and the record of skips the gtest processes keep;
# inside pytest, DTRAIN_FAIL_ON_SKIP): CI runs as root with network namespaces, so a test that
# skips there for want of them has silently not run.
set -euo pipefail
cd "$(dirname "$0")/.."
# The commit-msg hook (.githooks/) refuses a long subject when the commit is made. Set only where
# no hooks path is set, so that a developer's own hooks stay theirs.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && ! git config core.hooksPath >/dev/null; then
  git config core.hooksPath .githooks
fi
# What the build and the checks need first; the rest of what the tests use (clang, Python's
# torch and torchvision, chromium, nginx...) installs while the project builds, which on a fresh
# machine takes minutes of mostly downloading. The tests wait for it.
deploy/install-deps.sh --checks
test_deps_log=$(mktemp)
deploy/install-deps.sh --test >"$test_deps_log" 2>&1 &
test_deps=$!
# An apt-get is never killed halfway (it would leave dpkg to repair); its log goes either way.
trap 'rm -f "$test_deps_log"' EXIT
tests/check_format.sh
python3 tests/check_docs.py --self-test
python3 tests/check_docs.py
python3 tests/check_skips.py --self-test
tests/check_commit_subjects.sh
python3 tests/check_layering.py
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON -DDTRAIN_BUILD_TESTS=ON
cmake --build build -j"$(nproc)"
if ! wait "$test_deps"; then
  cat "$test_deps_log" >&2
  echo "tests/run.sh: installing the tests' dependencies failed" >&2
  exit 1
fi
deploy/install-python-package.sh
# clang's checks and the benchmarks' build need CPU time but keep no time: they run in the idle
# scheduling class (SCHED_IDLE) beside the tests, which leave about a quarter of the two cores
# unused while they wait on timeouts, processes and sockets, so they take only what the tests
# leave. Their output is printed once the tests are done; the load tests wait for them. They get
# a process group of their own (set -m), so that an early exit stops all of them, in this
# session: where the kernel shares CPU time by session (autogroup), a new session would get
# half of it whatever its class.
set -m
chrt --idle 0 bash -c 'tests/run_clang_checks.sh build &&
  cmake --build build --target dtrain_benches -j"$(nproc)"' >build/idle-checks.log 2>&1 &
idle_checks=$!
set +m
trap 'rm -f "$test_deps_log"; kill -- -"$idle_checks" 2>/dev/null || true' EXIT
cd build
export DTRAIN_FAIL_ON_SKIP=1
# Every gtest process appends its skipped tests here (tests/test_main.cc), for check_skips.py.
export DTRAIN_SKIP_LOG="$PWD/skipped-tests.txt"
rm -f "$DTRAIN_SKIP_LOG"
ctest --output-on-failure -LE load -j2 --output-junit ctest-results.xml
idle_status=0
wait "$idle_checks" || idle_status=$?
cat idle-checks.log
[ "$idle_status" -eq 0 ] || { echo "tests/run.sh: clang's checks or the benchmarks' build failed" >&2; exit 1; }
ctest --output-on-failure -L load --output-junit ctest-load-results.xml
python3 ../tests/check_skips.py --skip-log "$DTRAIN_SKIP_LOG" ctest-results.xml \
  ctest-load-results.xml

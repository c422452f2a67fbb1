#!/usr/bin/env bash
# The test command: installs dependencies (idempotent), checks formatting and the worker's
# layering (tests/check_layering.py), builds with -Werror, runs clang's thread-safety analysis
# over common/, coordinator/, client/ and worker/, and runs ctest.
# The 64-rank load test runs alone after the others, so its CPU load cannot starve their
# timing-sensitive liveness checks on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh --test
tests/check_format.sh
python3 tests/check_layering.py
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON -DDTRAIN_BUILD_TESTS=ON
cmake --build build -j"$(nproc)"
deploy/install-python-package.sh
tests/run_clang_checks.sh build
cd build
ctest --output-on-failure -LE load -j2
ctest --output-on-failure -L load

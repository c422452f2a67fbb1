#!/usr/bin/env bash
# The main demo on a fresh Debian machine: installs dependencies (Fashion-MNIST included),
# builds, starts a local cluster (a coordinator and 2 workers on 127.0.0.1), submits the CNN on
# Fashion-MNIST with ddp, watches it, and prints the test accuracy. Exits non-zero if the job
# fails. The best checkpoint is downloaded to build/local-cluster/<job>/ (as from any remote
# cluster). The cluster is stopped at the end; its logs and metrics (CSV, TensorBoard) stay under
# build/local-cluster/state/jobs/.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON \
  -DDTRAIN_BUILD_WORKER=ON >/dev/null
cmake --build build --target dtrain-coordinator dtrain-worker dtrain dtrain_python
deploy/install-python-package.sh
export DTRAIN_LOCAL_DIR=${DTRAIN_LOCAL_DIR:-$PWD/build/local-cluster}
deploy/local/cluster.sh stop >/dev/null || true
deploy/local/cluster.sh start --port 0 --workers 2
trap 'deploy/local/cluster.sh stop' EXIT
export DTRAIN_COORDINATOR="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
start=$(date +%s)
job=$(build/client/dtrain fit --output json --config "${DTRAIN_DEMO_JOB:-deploy/local/fashion-cnn.yaml}" |
      sed -n 's/^ *"id": "\([^"]*\)".*/\1/p' | head -1)
echo "submitted $job; watching it (Ctrl-C stops watching, not the job)"
build/client/dtrain watch "$job"
build/client/dtrain results "$job" --plot "$DTRAIN_LOCAL_DIR/$job.svg"
echo "test accuracy: $(build/client/dtrain results "$job" --output json | sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p')"
echo "wall time: $(( $(date +%s) - start )) s (job $job; curves in $DTRAIN_LOCAL_DIR/$job.svg)"
build/client/dtrain download "$job" best -o "$DTRAIN_LOCAL_DIR/$job"

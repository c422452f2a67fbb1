#!/usr/bin/env bash
# The main demo on a fresh Debian machine: installs dependencies, builds, starts a local
# cluster and runs a job on it. Until dtrain-worker and job submission land (issues 3 and 4),
# the job is a 4-rank collectives program; it becomes the Fashion-MNIST training job then.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${DTRAIN_DEMO_RANKS:-4}
deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_WORKER=OFF >/dev/null
cmake --build build --target dtrain-coordinator dtrain-collectives-demo
export DTRAIN_LOCAL_DIR=${DTRAIN_LOCAL_DIR:-$PWD/build/local-cluster}
deploy/local/cluster.sh stop >/dev/null || true
deploy/local/cluster.sh start --port 0
trap 'deploy/local/cluster.sh stop' EXIT
address="127.0.0.1:$(cat "$DTRAIN_LOCAL_DIR/port")"
pids=()
for _ in $(seq "$ranks"); do
  build/client/dtrain-collectives-demo --coordinator="$address" --group=demo --world_size="$ranks" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status

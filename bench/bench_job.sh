# Sourced by the benches that run the training benches' job (bench/bench-job.yaml): submitting
# it with overrides and asking its state, through the dtrain client of a build directory, on
# the cluster $DTRAIN_COORDINATOR names. One place, so that every bench submits the same spec
# and reads the client's answers the same way.

# bench_job_submit BUILD_DIR [dtrain fit overrides...]: prints the queued job's id (nothing if
# the client refused it, having said why on stderr).
bench_job_submit() {
  local build=$1
  shift
  "$build/client/dtrain" fit --output json --config "$(dirname "${BASH_SOURCE[0]}")/bench-job.yaml" \
    "$@" | sed -n 's/^ *"id": "\([^"]*\)".*/\1/p' | head -1
}

# bench_job_state BUILD_DIR JOB_ID: prints the job's state (QUEUED, RUNNING, SUCCEEDED, ...).
bench_job_state() {
  "$1/client/dtrain" status "$2" --output json |
    /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])'
}

# Sourced by the benches that run dtrain jobs: submitting a spec (the training benches' own,
# bench/bench-job.yaml, or another) with overrides, waiting for a job with a deadline, and
# asking its state, through the dtrain client of a build directory, on the cluster
# $DTRAIN_COORDINATOR names. One place, so that every bench submits the same spec and reads the
# client's answers the same way.

# bench_submit BUILD_DIR CONFIG [dtrain fit overrides...]: prints the queued job's id; fails when
# the client refused the job, with its reason on stderr (with --output json the client prints a
# refusal as {"error": ...} on stdout, where no one would see it).
bench_submit() {
  local build=$1 config=$2 out
  shift 2
  out=$("$build/client/dtrain" fit --output json --config "$config" "$@") || true
  /usr/bin/python3 -c '
import json, sys
text = sys.argv[1]
# The queued job, pretty-printed; or a refusal, on one line.
for chunk in [text] + text.splitlines():
    try:
        reply = json.loads(chunk)
    except ValueError:
        continue
    if isinstance(reply, dict) and "id" in reply:
        print(reply["id"])
        sys.exit(0)
    if isinstance(reply, dict) and "error" in reply:
        sys.exit("dtrain fit refused the job: " + reply["error"].get("message", chunk))
sys.exit("dtrain fit gave no job id: " + text.strip())' "$out"
}

# bench_job_submit BUILD_DIR [dtrain fit overrides...]: bench_submit of bench/bench-job.yaml.
bench_job_submit() {
  local build=$1
  shift
  bench_submit "$build" "$(dirname "${BASH_SOURCE[0]}")/bench-job.yaml" "$@"
}

# bench_job_wait BUILD_DIR JOB_ID [SECONDS]: watches the job to its end. One that has not ended
# within SECONDS (default 600) is cancelled rather than waited for: its state then says so.
bench_job_wait() {
  timeout "${3:-600}" "$1/client/dtrain" watch "$2" >/dev/null ||
    "$1/client/dtrain" cancel "$2" >/dev/null 2>&1 || true
}

# bench_job_state BUILD_DIR JOB_ID: prints the job's state (QUEUED, RUNNING, SUCCEEDED, ...).
bench_job_state() {
  "$1/client/dtrain" status "$2" --output json |
    /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])'
}

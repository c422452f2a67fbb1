# Sourced by the benches that run dtrain jobs: submitting a spec (the training benches' own,
# bench/bench-job.yaml, or another) with overrides, waiting for a job with a deadline, and
# asking its state or progress, through the dtrain client of a build directory, on the cluster
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

# bench_job_status_value BUILD_DIR JOB_ID KEY...: prints the value at KEY... (nested) of the
# job's status as `dtrain status --output json` gives it; 0 where a key is absent, since the JSON
# form of a protobuf leaves out fields at their zero value.
bench_job_status_value() {
  local build=$1 id=$2
  shift 2
  "$build/client/dtrain" status "$id" --output json | /usr/bin/python3 -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1:]:
    value = value.get(key, 0) if isinstance(value, dict) else 0
print(value)' "$@"
}

# bench_job_state BUILD_DIR JOB_ID: prints the job's state (QUEUED, RUNNING, SUCCEEDED, ...).
bench_job_state() { bench_job_status_value "$1" "$2" state; }

# bench_job_progress BUILD_DIR JOB_ID: prints the job's global step so far (0 before its first
# call answers).
bench_job_progress() { bench_job_status_value "$1" "$2" progress global_step; }

# bench_job_result BUILD_DIR JOB_ID WHAT: one JSON object of a finished job: samples_per_s (the
# trainer's training rate), plane, and from its log each rank's mean batch (batch_ms), its phases
# (phases_ms, per rank: data, forward, backward, averaging, optimizer), its time in steps outside
# them (other_ms), the larger rank's share of its step time spent waiting for its core
# (core_wait_share; null where the kernel does not say) and the coordinator's time between calls
# (between_s). Fails, naming WHAT, unless the job SUCCEEDED. One parser for every bench that
# reads a job's log, so that they read it alike.
bench_job_result() {
  local build=$1 id=$2 what=$3 log
  log=$("$build/client/dtrain" logs "$id" || true)
  "$build/client/dtrain" status "$id" --output json | /usr/bin/python3 -c '
import json, re, sys
s = json.load(sys.stdin)
what, lines = sys.argv[1], sys.argv[2].splitlines()
state, reason = s["state"], s.get("reason", "")
if state != "SUCCEEDED":
    sys.exit(f"{what}: the job ended {state}: {reason}")
def line(key):
    return next((l for l in lines if key in l), "")
shares = [float(m) for m in re.findall(r"\(([0-9.]+)%\) for its core", line("time by rank: "))]
ranks = [[float(x) for x in m] for m in re.findall(
    r"rank \d+ ([0-9.]+) ms: data ([0-9.]+), forward ([0-9.]+), backward ([0-9.]+), "
    r"averaging gradients ([0-9.]+), optimizer ([0-9.]+), other ([0-9.]+)",
    line("time per batch by rank: "))]
between = re.search(r"between steps \(the coordinator\) ([0-9.]+) s of", line("time by rank: "))
p = s["progress"]
print(json.dumps({"samples_per_s": p.get("train_samples_per_second") or p["samples_per_second"],
                  "plane": p.get("collective_plane", ""),
                  "batch_ms": [r[0] for r in ranks], "phases_ms": [r[1:6] for r in ranks],
                  "other_ms": [r[6] for r in ranks],
                  "core_wait_share": max(shares) / 100 if shares else None,
                  "between_s": float(between.group(1)) if between else None}))' "$what" "$log"
}

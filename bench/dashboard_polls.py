#!/usr/bin/env python3
"""What the dashboard's live views cost a coordinator that keeps a long history: its database
seeded with --jobs ended jobs (as months of use leave it), the coordinator's CPU time for
--requests GETs of /api/v1/cluster (the cluster page asks every 2 s), for as many of
/api/v1/workers (no worker registered: an answer with nothing behind it, this machine's reference
for one request), and over --stream_seconds with one /api/v1/events stream open (the jobs page,
which the coordinator checks twice a second) against as long with none.

Two coordinator binaries (--a, --b) run in alternated rounds, each in a fresh process on a fresh
copy of one seeded database, so that their ratio comes from one machine and one time.

  bench/dashboard_polls.sh [--a BUILD_DIR] [--b BUILD_DIR] [--jobs N] [--rounds N]
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request

from alternated import alternate, medians, stop


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_file(path, proc, what):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"the coordinator exited before writing its {what}")
        time.sleep(0.05)
    raise RuntimeError(f"the coordinator wrote no {what} in 60 s")


def get(url):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read()


def measure(binary, seeded, args):
    with tempfile.TemporaryDirectory() as work:
        state = os.path.join(work, "state")
        os.makedirs(state)
        shutil.copy(seeded, os.path.join(state, "coordinator.db"))
        with open(os.path.join(work, "coordinator.log"), "wb") as log:
            proc = subprocess.Popen(
                [binary, "--listen=127.0.0.1:0", f"--port_file={work}/port",
                 f"--state_dir={state}", "--log_level=warning", "--http_listen=127.0.0.1:0",
                 f"--http_port_file={work}/http.port"],
                stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_file(f"{work}/port", proc, "port")
            base = f"http://127.0.0.1:{wait_file(f'{work}/http.port', proc, 'HTTP port')}"
            summary = json.loads(get(base + "/api/v1/cluster"))
            ended = sum(summary.get("jobsByState", {}).get(s, 0)
                        for s in ("SUCCEEDED", "FAILED", "CANCELLED"))
            if ended != args.jobs:
                raise RuntimeError(f"the coordinator counts {ended} ended jobs; {args.jobs} seeded")
            time.sleep(1)
            out = {}
            for name, path in (("cluster", "/api/v1/cluster"), ("workers", "/api/v1/workers")):
                before = cpu_seconds(proc.pid)
                for _ in range(args.requests):
                    get(base + path)
                out[f"{name}_cpu_ms"] = (cpu_seconds(proc.pid) - before) * 1000 / args.requests
            before = cpu_seconds(proc.pid)
            time.sleep(args.stream_seconds)
            idle = cpu_seconds(proc.pid) - before
            received = []
            done = threading.Event()

            def read_stream():
                with urllib.request.urlopen(base + "/api/v1/events", timeout=30) as stream:
                    while not done.is_set():
                        line = stream.readline()
                        if not line:
                            return
                        received.append(line)

            reader = threading.Thread(target=read_stream, daemon=True)
            reader.start()
            time.sleep(1)  # the first round, which notes the history, left out
            before = cpu_seconds(proc.pid)
            time.sleep(args.stream_seconds)
            streaming = cpu_seconds(proc.pid) - before
            done.set()
            out["stream_cpu_percent"] = 100 * (streaming - idle) / args.stream_seconds
            out["idle_cpu_percent"] = 100 * idle / args.stream_seconds
            return out
        finally:
            stop(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="a dtrain-coordinator binary")
    parser.add_argument("--b", help="another, measured in alternation")
    parser.add_argument("--seed", required=True, help="dtrain-bench-coordinator-scale")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--stream_seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.jobs <= 100000 or not 1 <= args.requests <= 10000:
        parser.error("--jobs: 1 to 100,000; --requests: 1 to 10,000")
    if not 1 <= args.rounds <= 50 or not 1 <= args.stream_seconds <= 600:
        parser.error("--rounds: 1 to 50; --stream_seconds: 1 to 600")
    with tempfile.TemporaryDirectory() as work:
        seeded = os.path.join(work, "coordinator.db")
        subprocess.run([args.seed, f"--seed_db={seeded}", f"--ended_jobs={args.jobs}"],
                       check=True, stdout=subprocess.DEVNULL)
        sides = {"a": args.a} if not args.b else {"a": args.a, "b": args.b}
        results = alternate(sides, args.rounds,
                            lambda side, binary: measure(binary, seeded, args))
    summary = medians(results, sides)
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.jobs} ended jobs, medians of {args.rounds} rounds")
    print("| side | /api/v1/cluster (CPU ms) | /api/v1/workers, empty (CPU ms) | cluster / workers "
          "| one event stream (CPU %) | idle (CPU %) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for side, s in summary.items():
        print(f"| {side}: {s['binary']} | {s['cluster_cpu_ms']:.2f} | {s['workers_cpu_ms']:.2f} | "
              f"{s['cluster_cpu_ms'] / max(s['workers_cpu_ms'], 1e-9):.1f}x | "
              f"{s['stream_cpu_percent']:.2f} | {s['idle_cpu_percent']:.2f} |")
    if "b" in summary:
        a, b = summary["a"], summary["b"]
        print(f"b / a: cluster request CPU {b['cluster_cpu_ms'] / a['cluster_cpu_ms']:.3f}x, "
              f"stream CPU {b['stream_cpu_percent'] / max(a['stream_cpu_percent'], 1e-9):.3f}x")


if __name__ == "__main__":
    main()

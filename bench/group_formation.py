#!/usr/bin/env python3
"""What a coordinator pays to form one large group: --ranks registrations sent at once (from
grpcio, as N processes would), timed from the first call to the last answer, with the
coordinator's CPU time and its peak memory (VmHWM) growth over the formation. Each answer lists
every member, so a group of N answers N² member entries in all; the coordinator either builds
each answer whole or shares one encoded list between them.

Two coordinator binaries (--a, --b: for instance main's and an older commit's) are measured in
alternated rounds, each in a fresh process, so that their ratio comes from one machine and one
time. The client reads each answer's bytes without parsing them, so that its cost is the same for
both; after the timing, one answer per round is parsed and must list every member with the
member's own rank, and both sides must have answered the same number of bytes. The coordinator's
heartbeat timeout is 10 minutes: the bench sends no heartbeats, and a group that failed midway
would shut down differently.

--omit_members SIDE has that side's ranks set RegisterRequest.omit_members, as dtrain's workers
do (without --b, side b is --a's binary again): its answers must list no member, and the sides'
bytes then differ by the list.

  bench/group_formation.sh [--ranks N] [--rounds N] [--a BIN] [--b BIN] [--omit_members a|b]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import grpc

from alternated import alternate, medians, stop
from dtrain.v1 import coordinator_pb2


def proc_numbers(pid):
    """(peak RSS in bytes, user+system CPU seconds) of a process."""
    peak = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return peak, (int(fields[11]) + int(fields[12])) / ticks


def wait_port(proc, binary, work):
    port_file = os.path.join(work, "port")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(port_file):
            with open(port_file) as f:
                text = f.read().strip()
            if text:
                return int(text)
        if proc.poll() is not None:
            with open(os.path.join(work, "coordinator.log")) as f:
                raise RuntimeError(f"{binary} exited: {f.read()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{binary} wrote no port in 30 s")


def check_answer(answer, ranks, omit):
    """One answer, parsed: every member listed, in rank order, the caller among them; or, where
    the rank asked to go without the list, none."""
    response = coordinator_pb2.RegisterResponse.FromString(answer)
    if omit:
        if response.members or response.world_size != ranks or response.member.incarnation != 1000:
            raise RuntimeError(f"an answer without the list holds {len(response.members)} members "
                               f"of a group of {response.world_size}, incarnation "
                               f"{response.member.incarnation}; rank 0 is 1000")
        return
    if len(response.members) != ranks or response.world_size != ranks:
        raise RuntimeError(f"an answer lists {len(response.members)} members of a group of "
                           f"{response.world_size}; {ranks} registered")
    if [m.rank for m in response.members] != list(range(ranks)):
        raise RuntimeError("an answer's members are not in rank order")
    if response.members[response.rank].incarnation != response.member.incarnation:
        raise RuntimeError("an answer's own rank is another member's")


def form(binary, ranks, hosts, omit):
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "coordinator.log"), "wb") as log:
            proc = subprocess.Popen(
                [binary, "--listen=127.0.0.1:0", f"--port_file={os.path.join(work, 'port')}",
                 f"--state_dir={os.path.join(work, 'state')}", "--log_level=warning",
                 "--heartbeat_timeout=10m"],
                stdout=subprocess.DEVNULL, stderr=log)
        channels = []
        try:
            port = wait_port(proc, binary, work)
            # Several connections, as ranks on many hosts would use; each answer is read raw.
            channels += [grpc.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_receive_message_length", 64 << 20), ("dtrain.bench_channel", i)])
                for i in range(16)]
            calls = [c.unary_unary("/dtrain.v1.Coordinator/Register",
                                   request_serializer=lambda r: r.SerializeToString(),
                                   response_deserializer=lambda b: len(b)) for c in channels]
            kept = channels[0].unary_unary("/dtrain.v1.Coordinator/Register",
                                           request_serializer=lambda r: r.SerializeToString())
            for c in channels:
                grpc.channel_ready_future(c).result(timeout=30)
            time.sleep(0.2)
            peak0, cpu0 = proc_numbers(proc.pid)
            start_time = time.monotonic()
            futures = []
            for i in range(ranks):
                request = coordinator_pb2.RegisterRequest(
                    group="big", host=f"node-{i % hosts:04d}.rack-{i % 7}.cluster.example.com",
                    local_devices=1, incarnation=1000 + i, world_size=ranks, timeout_ms=300_000,
                    name=f"worker-{i % hosts:04d}/{i // hosts}", omit_members=omit)
                call = kept if i == 0 else calls[i % len(calls)]
                futures.append(call.future(request, timeout=300))
            sizes = [f.result() for f in futures]
            took = time.monotonic() - start_time
            peak1, cpu1 = proc_numbers(proc.pid)
            # After the timing: rank 0's answer (kept whole) parsed, as each rank parses its own.
            check_answer(futures[0].result(), ranks, omit)
            sizes[0] = len(sizes[0])
            return {"seconds": took, "cpu_seconds": cpu1 - cpu0,
                    "peak_growth_mb": (peak1 - peak0) / 1e6, "answer_bytes": sum(sizes)}
        finally:
            for c in channels:
                c.close()
            stop(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2048)
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--a", required=True, help="a dtrain-coordinator binary")
    parser.add_argument("--b", help="another, measured in alternation")
    parser.add_argument("--omit_members", choices=["a", "b"],
                        help="that side's ranks go without the member list")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.omit_members == "b" and not args.b:
        args.b = args.a
    if not 1 <= args.ranks <= 4096:
        parser.error("--ranks: 1 to 4096 (a group's bound)")
    if not 1 <= args.hosts <= args.ranks:
        parser.error("--hosts: 1 to --ranks")
    if not 1 <= args.rounds <= 50:
        parser.error("--rounds: 1 to 50")
    sides = {"a": args.a} if not args.b else {"a": args.a, "b": args.b}
    results = alternate(sides, args.rounds, lambda side, binary: form(
        binary, args.ranks, args.hosts, args.omit_members == side))
    for side, runs in results.items():
        answered = {run["answer_bytes"] for run in runs}
        if len(answered) != 1:
            sys.exit(f"side {side}'s rounds answered different bytes: {sorted(answered)}")
    answered = {run["answer_bytes"] for runs in results.values() for run in runs}
    if len(answered) != 1 and not args.omit_members:
        sys.exit(f"the sides answered different bytes: {sorted(answered)}")
    summary = medians(results, sides)
    for side in summary:
        summary[side]["omit_members"] = args.omit_members == side
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.ranks} ranks on {args.hosts} hosts, medians of {args.rounds} rounds")
    print("| side | formation (s) | coordinator CPU (s) | peak memory growth (MB) | answers (MB) |")
    print("| --- | --- | --- | --- | --- |")
    for side, s in summary.items():
        omitted = " (omit_members)" if s["omit_members"] else ""
        print(f"| {side}: {s['binary']}{omitted} | {s['seconds']:.2f} | {s['cpu_seconds']:.2f} | "
              f"{s['peak_growth_mb']:.0f} | {s['answer_bytes'] / 1e6:.0f} |")
    if "b" in summary:
        a, b = summary["a"], summary["b"]
        print(f"b / a: formation {b['seconds'] / a['seconds']:.2f}x, CPU "
              f"{b['cpu_seconds'] / max(a['cpu_seconds'], 1e-9):.2f}x, memory growth "
              f"{b['peak_growth_mb'] / max(a['peak_growth_mb'], 1e-9):.2f}x, answers "
              f"{b['answer_bytes'] / max(a['answer_bytes'], 1):.4f}x")


if __name__ == "__main__":
    main()

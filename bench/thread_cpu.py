#!/usr/bin/python3
"""Who had the cores while a job trained: every thread's CPU time, before and after.

A job's log gives each rank's wait for its core (the step thread's run-queue time), not who took
it. `snapshot FILE` writes every thread's user+system time (and each process's reaped children's,
so that short-lived commands count towards the process that ran them) with the machine's busy
time; `diff BEFORE AFTER --workers=PID,...` prints, as one JSON line, the CPU seconds the workers'
step threads took (each worker's busiest thread), everything else took, and the largest others by
thread name and process. Threads that started and ended between the two snapshots are missed
unless their process was reaped by one alive at both ends. `step-threads --workers=PID,...` prints
each worker's step thread now, as PID/TID: its busiest thread since the thread started (diff's
rule over the whole of each thread's life, not a window), in its process or a child's; with
--pinned only threads allowed on a single core count.
"""
import argparse
import json
import os
import sys

TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(path):
    """The fields of a /proc stat file after the command name (which may hold spaces)."""
    with open(path) as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()


def comm(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def snapshot():
    threads, processes = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        name = comm(f"/proc/{pid}/comm")
        try:
            f = stat_fields(f"/proc/{pid}/stat")
            # Its parent, and cutime + cstime: the children it has waited for.
            processes[pid] = {"name": name, "parent": f[1],
                              "children_s": (int(f[13]) + int(f[14])) / TICK}
            tids = os.listdir(f"/proc/{pid}/task")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        for tid in tids:
            try:
                f = stat_fields(f"/proc/{pid}/task/{tid}/stat")
            except (OSError, ValueError):
                continue
            threads[tid] = [pid, name, comm(f"/proc/{pid}/task/{tid}/comm"),
                            (int(f[11]) + int(f[12])) / TICK]
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    # user, nice, system, irq, softirq (not idle, iowait, steal, guest: guest is in user).
    busy = (cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6]) / TICK
    return {"threads": threads, "processes": processes, "busy_s": busy}


def worker_of(pid, workers, processes):
    """The worker a thread of process `pid` steps for: the worker itself, or the worker whose child
    it is (a worker that runs a job's rank in a child process, worker.proto's isolation)."""
    if pid in workers:
        return pid
    parent = processes.get(pid, {}).get("parent")
    return parent if parent in workers else None


def busiest(candidates):
    """{worker: (key, seconds)} of each worker's busiest candidate: its step thread."""
    best = {}
    for worker, key, seconds in candidates:
        if worker is not None and (worker not in best or seconds > best[worker][1]):
            best[worker] = (key, seconds)
    return best


def pinned_to_one_core(pid, tid):
    """A worker given --cpus pins its step thread to one core, and a thread that the step thread
    starts inherits it; the daemon's other threads may run anywhere."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip().isdigit()
    except OSError:
        pass
    return False


def step_threads(now, workers, pinned):
    """Each worker's step thread as "PID/TID", in the order of `workers`; None where none is
    found."""
    candidates = []
    for tid, (pid, _, _, seconds) in now["threads"].items():
        worker = worker_of(pid, workers, now["processes"])
        if worker is not None and (not pinned or pinned_to_one_core(pid, tid)):
            candidates.append((worker, f"{pid}/{tid}", seconds))
    best = busiest(candidates)
    return [best[w][0] if w in best else None for w in workers]


def diff(before, after, workers):
    ran = []  # (worker or None, (process, thread name), seconds)
    processes = after["processes"]
    for tid, (pid, pname, tname, t) in after["threads"].items():
        old = before["threads"].get(tid)
        d = t - (old[3] if old and old[0] == pid else 0.0)  # a reused tid starts from 0
        if d > 0:
            ran.append((worker_of(pid, workers, processes), (pname, tname), d))
    for pid, p in processes.items():
        d = p["children_s"] - before["processes"].get(pid, p)["children_s"]
        if d > 0:
            ran.append((None, (p["name"], None), d))
    # Each worker's busiest thread is its step thread; everything else took from it.
    steps = {i for i, _ in busiest((w, i, d) for i, (w, _, d) in enumerate(ran)).values()}
    taken = {}
    for i, (_, key, d) in enumerate(ran):
        if i not in steps:
            taken[key] = taken.get(key, 0.0) + d
    largest = sorted(taken.items(), key=lambda kv: -kv[1])[:5]
    return {"step_threads_s": round(sum(ran[i][2] for i in steps), 2),
            "others_s": round(sum(taken.values()), 2),
            "machine_busy_s": round(after["busy_s"] - before["busy_s"], 2),
            "largest_others": [[f"{t} ({p})" if t else f"{p}'s reaped children", round(d, 2)]
                               for (p, t), d in largest]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("snapshot").add_argument("file")
    d = commands.add_parser("diff")
    d.add_argument("before")
    d.add_argument("after")
    d.add_argument("--workers", required=True, help="the workers' process ids, comma-separated")
    s = commands.add_parser("step-threads")
    s.add_argument("--workers", required=True, help="the workers' process ids, comma-separated")
    s.add_argument("--pinned", action="store_true",
                   help="only threads allowed on a single core (a worker given --cpus)")
    args = parser.parse_args()
    if args.command == "snapshot":
        with open(args.file, "w") as f:
            json.dump(snapshot(), f)
        return 0
    if args.command == "step-threads":
        workers = [w for w in args.workers.split(",") if w]
        found = step_threads(snapshot(), workers, args.pinned)
        for worker, thread in zip(workers, found):
            if thread is None:
                why = "none pinned to one core" if args.pinned else "is it running?"
                print(f"thread_cpu.py: worker {worker} has no step thread ({why})",
                      file=sys.stderr)
                return 1
            print(thread)
        return 0
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    print(json.dumps(diff(before, after, set(filter(None, args.workers.split(","))))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

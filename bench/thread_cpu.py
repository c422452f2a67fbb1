#!/usr/bin/python3
"""Who had the cores while a job trained: every thread's CPU time, before and after.

A job's log gives each rank's wait for its core (the step thread's run-queue time), not who took
it. `snapshot FILE` writes every thread's user+system time (and each process's reaped children's,
so that short-lived commands count towards the process that ran them) with the machine's busy
time; `diff BEFORE AFTER --workers PID,...` prints, as one JSON line, the CPU seconds the workers'
step threads took (each worker's busiest thread), everything else took, and the largest others by
thread name and process. Threads that started and ended between the two snapshots are missed
unless their process was reaped by one alive at both ends.
"""
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
    threads, children = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        name = comm(f"/proc/{pid}/comm")
        try:
            f = stat_fields(f"/proc/{pid}/stat")
            # cutime and cstime: the children this process has waited for.
            children[pid] = [name, (int(f[13]) + int(f[14])) / TICK, f[1]]
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
    return {"threads": threads, "children": children, "busy_s": busy}


def diff(before, after, workers):
    taken = {}  # (process, thread name) -> seconds
    step_threads = {}  # worker pid -> (tid, seconds)
    # A worker that runs a job's rank in a child process (worker.proto's isolation) steps there.
    parent = {pid: c[2] for pid, c in after["children"].items()}
    for tid, (pid, pname, tname, t) in after["threads"].items():
        old = before["threads"].get(tid)
        d = t - (old[3] if old and old[0] == pid else 0.0)
        if d <= 0:
            continue
        worker = pid if pid in workers else parent.get(pid)
        if worker in workers and d > step_threads.get(worker, (None, 0.0))[1]:
            if worker in step_threads:
                prev_tid, prev_d = step_threads[worker]
                prev = after["threads"][prev_tid]
                taken[(prev[1], prev[2])] = taken.get((prev[1], prev[2]), 0.0) + prev_d
            step_threads[worker] = (tid, d)
            continue
        taken[(pname, tname)] = taken.get((pname, tname), 0.0) + d
    for pid, (pname, c, _) in after["children"].items():
        old = before["children"].get(pid)
        d = c - (old[1] if old else c)
        if d > 0:
            key = (pname, None)
            taken[key] = taken.get(key, 0.0) + d
    largest = sorted(taken.items(), key=lambda kv: -kv[1])[:5]
    return {"step_threads_s": round(sum(d for _, d in step_threads.values()), 2),
            "others_s": round(sum(taken.values()), 2),
            "machine_busy_s": round(after["busy_s"] - before["busy_s"], 2),
            "largest_others": [[f"{t} ({p})" if t else f"{p}'s reaped children", round(d, 2)]
                               for (p, t), d in largest]}


def main(argv):
    if len(argv) == 3 and argv[1] == "snapshot":
        with open(argv[2], "w") as f:
            json.dump(snapshot(), f)
        return 0
    if len(argv) == 5 and argv[1] == "diff" and argv[4].startswith("--workers="):
        with open(argv[2]) as f:
            before = json.load(f)
        with open(argv[3]) as f:
            after = json.load(f)
        workers = set(filter(None, argv[4][len("--workers="):].split(",")))
        print(json.dumps(diff(before, after, workers)))
        return 0
    print("usage: thread_cpu.py snapshot FILE | diff BEFORE AFTER --workers=PID,...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

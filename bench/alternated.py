"""A/B rounds shared by the coordinator benches (group_formation.py, dashboard_polls.py): sides
measured in alternated order round by round, so that their ratio comes from one machine at one
time, and the medians of each side's measurements."""

import json
import statistics
import subprocess
import sys


def stop(proc):
    """Terminates a process and reaps it, killing it after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def alternate(sides, rounds, measure):
    """{side: [measure(side, binary) of each round]}: a then b in even rounds, b then a in odd
    ones. Each round's figures go to stderr as they come."""
    results = {side: [] for side in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
        for side in order:
            results[side].append(measure(side, sides[side]))
            print(f"round {r + 1} {side}: {json.dumps(results[side][-1])}", file=sys.stderr)
    return results


def medians(results, sides):
    """{side: {figure: median over the rounds, "binary": the side's binary}}."""
    summary = {}
    for side, runs in results.items():
        summary[side] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        summary[side]["binary"] = sides[side]
    return summary

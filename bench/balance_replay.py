#!/usr/bin/env python3
"""Replays two free loops' step times to ask what splitting each step's global batch unevenly
(more samples to the rank that was faster in the previous window) could gain over equal shares
in a synchronous job. An estimate, not a run: a step's time on a rank is taken to scale with its
share of the samples, and the split follows the per-sample speed each rank showed over the
previous window (clamped to 30-70%, rounded to whole samples). Usage, after a ceiling sample
that kept its step times (bench/ceiling.sh writes them to WORK/ceiling-steps-{0,1}.txt):

    bench/balance_replay.py WORK/ceiling-steps-0.txt WORK/ceiling-steps-1.txt [--batch 64]

Prints the trace's statistics (spread, autocorrelation, correlation between the ranks) and, per
window length, the synchronous share with equal splits and with balanced ones."""
import argparse
import statistics


def read_steps(path):
    steps = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                steps.append(float(line))
            except ValueError:
                raise SystemExit(f"{path}:{number}: {line.strip()[:40]!r} is not a step time "
                                 "(one number per line, as bench/ceiling.sh writes them)")
            if not steps[-1] > 0:
                raise SystemExit(f"{path}:{number}: a step time must be positive, "
                                 f"not {line.strip()}")
    if len(steps) < 32 or len(set(steps)) < 2:
        raise SystemExit(f"{path}: {len(steps)} step times, {len(set(steps))} distinct; "
                         "at least 32 that vary are needed")
    return steps


def balanced_time(a, b, window, batch):
    total, share = 0.0, 0.5  # rank 0's share of the global batch
    for start in range(0, len(a), window):
        wa, wb = a[start:start + window], b[start:start + window]
        total += sum(max(x * share / 0.5, y * (1 - share) / 0.5) for x, y in zip(wa, wb))
        speed_a, speed_b = 1 / statistics.mean(wa), 1 / statistics.mean(wb)
        share = round(min(max(speed_a / (speed_a + speed_b), 0.3), 0.7) * 2 * batch) / (2 * batch)
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rank0")
    parser.add_argument("rank1")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    args = parser.parse_args()
    a, b = read_steps(args.rank0), read_steps(args.rank1)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    for name, steps in (("rank 0", a), ("rank 1", b)):
        ordered, mean = sorted(steps), statistics.mean(steps)
        lags = {lag: statistics.correlation(steps[:-lag], steps[lag:]) for lag in (1, 4, 16)}
        print(f"{name}: steps {ordered[n // 100] / mean:.2f}x-{ordered[n * 99 // 100] / mean:.2f}x "
              f"of the mean (1st-99th percentile); autocorrelation at lag 1 {lags[1]:.2f}, "
              f"4 {lags[4]:.2f}, 16 {lags[16]:.2f}")
    print(f"correlation between the ranks' steps: {statistics.correlation(a, b):.2f}")
    free = max(sum(a), sum(b))
    lockstep = sum(max(x, y) for x, y in zip(a, b))
    print(f"{n} steps; synchronous share with equal splits: {free / lockstep:.4f}")
    for window in (16, 4, 1):
        balanced = balanced_time(a, b, window, args.batch)
        print(f"balanced every {window:2d} step(s): share {free / balanced:.4f} "
              f"({lockstep / balanced:.4f}x equal splits)")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Whether two dtrain checkpoints hold the same training state, bit for bit.

    compare_checkpoints.py A.ckpt B.ckpt

Compares what a run's outcome is made of: every tensor of state_dict, optimizer_states and
lr_schedulers (dtype, shape and every byte), the other values there, and epoch and
global_step. The "dtrain" metadata (the job spec, the world size) and the Lightning version are
not compared: two runs of the same training differ there by design.

Prints one line per difference (with how many values differ and by how much), or one line
saying what was found equal. Exits 0 when the states are the same, 1 when they differ, 2 when
a file cannot be read. The end-to-end recovery tests run it with Debian's python3-torch
(tests/checkpoint_comparison.h)."""

import sys

import torch

COMPARED = ("state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step",
            "native_amp_scaling_state")


def as_bytes(t):
    """The tensor's bytes in element order (the exact bit patterns: -0.0 is not 0.0)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class Comparison:
    def __init__(self):
        self.differences = []
        self.tensors = 0
        self.values = 0

    def tensor(self, where, a, b):
        if a.dtype != b.dtype or a.shape != b.shape:
            self.differences.append(f"{where}: {a.dtype}{list(a.shape)} vs "
                                    f"{b.dtype}{list(b.shape)}")
            return
        self.tensors += 1
        self.values += a.numel()
        if torch.equal(as_bytes(a), as_bytes(b)):
            return
        if a.is_floating_point():
            differ = (a != b) | (a.isnan() != b.isnan())
            gap = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
            self.differences.append(f"{where}: {int(differ.sum())} of {a.numel()} values differ, "
                                    f"by up to {gap:.3g}")
        else:
            self.differences.append(f"{where}: {int((a != b).sum())} of {a.numel()} values differ")

    def value(self, where, a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                self.tensor(where, a, b)
            else:
                self.differences.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
        elif isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                if key not in a or key not in b:
                    self.differences.append(f"{where}[{key!r}]: only in "
                                            f"{'the first' if key in a else 'the second'}")
                else:
                    self.value(f"{where}[{key!r}]", a[key], b[key])
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                self.differences.append(f"{where}: {len(a)} items vs {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self.value(f"{where}[{i}]", x, y)
        elif type(a) is not type(b) or (a != b and not (a != a and b != b)):  # NaN equals NaN
            self.differences.append(f"{where}: {a!r} vs {b!r}")


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        a, b = (torch.load(path, map_location="cpu") for path in argv[1:])
    except Exception as e:  # torch.load raises many kinds; each means "not readable" here
        print(f"cannot read a checkpoint: {e}")
        return 2
    comparison = Comparison()
    for key in COMPARED:
        if key in a or key in b:
            comparison.value(key, a.get(key), b.get(key))
    if comparison.differences:
        print(f"{len(comparison.differences)} difference(s) between {argv[1]} and {argv[2]}:")
        for line in comparison.differences:
            print(f"  {line}")
        return 1
    print(f"the same training state: {comparison.tensors} tensors ({comparison.values} values) "
          f"bit for bit, epoch {a.get('epoch')}, global_step {a.get('global_step')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Synthetic WebDataset shards for the data benches: learnable 28x28 float images (class c
brightens rows 2c..2c+2, as dtrain's synthetic data) as .npy, a .cls label, and an optional .bin
padding field of --pad_kb KiB per sample that a job does not use but every rank must read, so a
set can be as large as a test of memory needs (4 GiB) while training stays cheap.

  bench/make_shards.py OUT_DIR --shards N --per_shard M [--pad_kb K] [--seed S]

Writes OUT_DIR/train-000000.tar ... and OUT_DIR/train.txt (each shard with its sample count).
Deterministic: the same arguments give the same bytes. Standard library and numpy only.
"""
import argparse
import io
import os
import tarfile

import numpy as np


def member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--per_shard", type=int, required=True)
    p.add_argument("--pad_kb", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    pad = rng.integers(0, 256, size=a.pad_kb * 1024, dtype=np.uint8).tobytes()
    lines = ["# bench/make_shards.py"]
    for s in range(a.shards):
        name = f"train-{s:06d}.tar"
        path = os.path.join(a.out, name)
        if not os.path.exists(path):
            with tarfile.open(path + ".part", "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in range(a.per_shard):
                    n = s * a.per_shard + i
                    label = int(rng.integers(0, 10))
                    x = rng.normal(0.0, 0.3, size=(1, 28, 28)).astype(np.float32)
                    x[0, 2 * label:2 * label + 3, :] += 1.0
                    buf = io.BytesIO()
                    np.save(buf, x)
                    key = f"{n:09d}"
                    member(tar, key + ".cls", str(label).encode())
                    member(tar, key + ".npy", buf.getvalue())
                    if pad:
                        member(tar, key + ".bin", pad)
            os.replace(path + ".part", path)
        lines.append(f"{name} samples:{a.per_shard}")
    with open(os.path.join(a.out, "train.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the packed_results fuzzer's seeds (tests/fuzz/corpus/packed_results/) with the
generated protobuf module (build/python, made by the build): an answer packed as a worker packs
it, the same answer as BatchResults, and misshapen ones (a value short, a rate row too many, more
stepped flags than batches, another call's first batch, packed and listed at once).

  python3 tests/fuzz/make_packed_results_corpus.py [BUILD_DIR]
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "build")
sys.path.insert(0, os.path.join(build, "python"))
from dtrain.v1 import worker_pb2  # noqa: E402

out = os.path.join(here, "corpus", "packed_results")
os.makedirs(out, exist_ok=True)


def packed(batches=4, names=("acc", "loss"), rates=("lr-SGD",)):
    r = worker_pb2.LocalResult(rank=1, global_step=9)
    p = r.packed
    p.first_batch_idx = 5
    p.scalar_names.extend(names)
    p.rate_names.extend(rates)
    for b in range(batches):
        p.sizes.append(64 - b)
        p.scalar_values.extend(0.5 * b + j for j in range(len(names)))
        p.optimizer_stepped.append(b % 2 == 1)
        p.step_skipped.append(False)
        if b % 2 == 1:
            p.rate_values.extend(0.1 for _ in rates)
    return r


def listed(batches=4):
    r = worker_pb2.LocalResult(rank=0, global_step=9)
    for b in range(batches):
        batch = r.batches.add(batch_idx=5 + b, size=64, optimizer_stepped=True)
        batch.scalars["loss"] = 0.25 * b
        batch.learning_rates["lr-SGD"] = 0.1
    return r


def write(name, message):
    with open(os.path.join(out, name), "wb") as f:
        f.write(message.SerializeToString())


write("packed.bin", packed())
write("listed.bin", listed())
short = packed()
del short.packed.scalar_values[-1]
write("value_short.bin", short)
extra = packed()
extra.packed.rate_values.append(0.2)
write("rate_row_extra.bin", extra)
flags = packed()
flags.packed.optimizer_stepped.append(True)
write("flag_extra.bin", flags)
write("no_names.bin", packed(names=(), rates=()))
elsewhere = packed()
elsewhere.packed.first_batch_idx = 6
write("first_elsewhere.bin", elsewhere)
both = packed()
both.batches.extend(listed(1).batches)
write("packed_and_listed.bin", both)

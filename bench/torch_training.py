"""The peer for bench/training.sh: the same MLP / CNN as dtrain's zoo in Python torch,
DistributedDataParallel over gloo, one process per rank (torch.multiprocessing), one compute
thread each, the same Fashion-MNIST files, batch and optimizer. Prints one JSON row."""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def load_images():
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(x.copy()).float() / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(3136, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def parse_cpus(text):
    cpus = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def run(rank, args, result):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=args.world_size)
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(Mlp() if args.model == "mlp" else Cnn())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.cpus:
        # Only the training thread, as a dtrain worker pins its step thread (gloo's threads,
        # started above, stay free): pid 0 is the calling thread.
        os.sched_setaffinity(0, parse_cpus(args.cpus[rank]))
    x, y = load_images()
    n = x.shape[0]
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        first = (step * args.world_size * args.batch + rank * args.batch) % (n - args.batch)
        xb, yb = x[first:first + args.batch], y[first:first + args.batch]
        # As dtrain's step and the ceiling's loop: backward hands over new gradients instead of
        # adding into zeros (torch's default since 2.0; torch 1.13's zero_grad() zeroes in place).
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    dist.barrier()
    if rank == 0:
        seconds = time.perf_counter() - start
        result["samples_per_s"] = args.steps * args.batch * args.world_size / seconds
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cpus", nargs="*", default=[],
                        help="each rank's cores (taskset list syntax), one per rank: pins its "
                             "training thread")
    args = parser.parse_args()
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(run, args=(args, result), nprocs=args.world_size, join=True)
        print(json.dumps({"system": "torch-ddp-gloo", "model": args.model,
                          "ranks": args.world_size, "batch": args.batch,
                          "samples_per_s": round(result["samples_per_s"], 1)}))


if __name__ == "__main__":
    main()

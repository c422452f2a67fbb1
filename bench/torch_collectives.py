"""torch.distributed (gloo) peer of dtrain-bench-collectives: same ops, same sizes, same JSON.

Run by bench/collectives.sh with Debian's /usr/bin/python3 and python3-torch; a benchmark
peer only, never a dtrain dependency.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def run(rank, world, port, barriers, sizes, seconds_per_size, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    rows = []
    for _ in range(100):
        dist.barrier()
    lat = []
    for _ in range(barriers):
        start = time.perf_counter()
        dist.barrier()
        lat.append((time.perf_counter() - start) * 1e6)
    rows.append(("barrier", 0, lat))
    for size in sizes:
        t = torch.zeros(size // 4, dtype=torch.float32)
        parts = [torch.empty_like(t) for _ in range(world)]
        for op, call in (("all_reduce", lambda: dist.all_reduce(t)),
                         ("broadcast", lambda: dist.broadcast(t, 0)),
                         ("all_gather", lambda: dist.all_gather(parts, t))):
            call()
            start = time.perf_counter()
            call()
            once = max(1e-6, time.perf_counter() - start)
            iters = torch.tensor([max(5, min(2000, int(seconds_per_size / once)))])
            dist.broadcast(iters, 0)
            lat = []
            for _ in range(int(iters.item())):
                start = time.perf_counter()
                call()
                lat.append((time.perf_counter() - start) * 1e6)
            rows.append((op, size, lat))
    if rank == 0:
        out = []
        for op, size, lat in rows:
            p50 = percentile(lat, 0.5)
            out.append({"system": "torch-gloo", "op": op, "ranks": world, "bytes": size,
                        "p50_us": round(p50, 1), "p99_us": round(percentile(lat, 0.99), 1),
                        "algbw_gbps": round(size / (p50 * 1e-6) / 1e9, 4) if size else 0.0})
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--barriers", type=int, default=2000)
    parser.add_argument("--sizes", default="4096,1048576,16777216,67108864")
    parser.add_argument("--seconds_per_size", type=float, default=3.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args.world_size, args.port, args.barriers, sizes,
                                           args.seconds_per_size, queue))
             for r in range(args.world_size)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()

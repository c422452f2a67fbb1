"""torchvision's input pipeline as users write it, for bench/data.sh: an ImageFolder of JPEGs
through a DataLoader (num_workers workers, batches of 64) with RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor and Normalize (the PIL path). One epoch; prints two JSON rows like
dtrain-bench-data-pipeline's: the steady state (from the end of the third batch to the last, as
dtrain's row is timed) and the whole epoch from the loader's creation (its workers' start
included).

    /usr/bin/python3 bench/data_torchvision.py <imagefolder> [--workers 2]
"""
import argparse
import json
import time

import torch
from torchvision import datasets, transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    # The main process only collects batches; the workers decode (each DataLoader worker runs
    # with one intra-op thread).
    torch.set_num_threads(1)
    dataset = datasets.ImageFolder(args.root, transform=transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ]))
    start = time.perf_counter()
    batch_size, prefetch_factor = 64, 2
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                         num_workers=args.workers, prefetch_factor=prefetch_factor)
    samples = 0
    batches = 0
    steady_start, steady_samples = None, 0
    for images, labels in loader:
        assert images.shape[1:] == (3, 224, 224)
        samples += images.shape[0]
        batches += 1
        if batches == 3:
            steady_start, steady_samples = time.perf_counter(), samples
    end = time.perf_counter()
    name = f"torchvision ImageFolder + DataLoader({args.workers} workers)"
    rows = [(name + ", whole epoch (start included)", samples, end - start)]
    # Batches prefetched when the clock starts (prefetch_factor per worker) are not counted, as
    # dtrain's window is not.
    prefetched = prefetch_factor * args.workers * batch_size
    if steady_start is not None and samples - steady_samples > prefetched:
        rows.insert(0, (name, samples - steady_samples - prefetched, end - steady_start))
    for system, count, seconds in rows:
        print(json.dumps({"system": system, "samples": count, "seconds": round(seconds, 3),
                          "samples_per_s": round(count / seconds, 1)}))

if __name__ == "__main__":
    main()

"""A synthetic ImageNet-like set for bench/data.sh, written once and reused:

    /usr/bin/python3 bench/data_make_images.py <dir> <count>

<dir>/imagefolder/class_NNN/img_NNNNNN.jpg (100 classes, torchvision's ImageFolder layout) and the
same JPEG bytes as WebDataset shards <dir>/shards/shard-NNNNNN.tar of 1,000 samples each
(<key>.jpg and <key>.cls). Each image is 200-320 px on each side, quality 90 (4:2:0, as PIL and
most photographs), with varied content: gradients, filled shapes, smooth noise and grain, so
that the JPEGs are about as expensive to decode as photographs of that size. <dir>/done-<count>
marks a complete set.
"""
import io
import os
import sys
import tarfile
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageDraw

CLASSES = 100
PER_SHARD = 1000


def make(index):
    rng = np.random.default_rng(index)
    w, h = (int(v) for v in rng.integers(200, 321, size=2))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = rng.uniform(0, np.pi)
    ramp = (np.cos(angle) * x + np.sin(angle) * y) / (w + h)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        a, b = rng.uniform(0, 255, size=2)
        img[..., c] = a + (b - a) * ramp
    # Smooth noise: a coarse random grid upsampled, like texture.
    coarse = rng.normal(0, 40, (h // 16 + 2, w // 16 + 2, 3)).astype(np.float32)
    smooth = np.asarray(Image.fromarray(np.clip(coarse + 128, 0, 255).astype(np.uint8)).resize(
        (w, h), Image.BICUBIC), np.float32) - 128
    img += smooth
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 12))):
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, size=2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, size=2))
        color = tuple(int(v) for v in rng.integers(0, 256, size=3))
        if rng.uniform() < 0.5:
            draw.ellipse([x0, y0, x1, y1], fill=color)
        else:
            draw.rectangle([x0, y0, x1, y1], fill=color)
    grain = rng.normal(0, 6, (h, w, 3))
    pixels = np.clip(np.asarray(im, np.float32) + grain, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return index, out.getvalue()


def main():
    root, count = sys.argv[1], int(sys.argv[2])
    done = os.path.join(root, f"done-{count}")
    if os.path.exists(done):
        return
    folder = os.path.join(root, "imagefolder")
    shards = os.path.join(root, "shards")
    for c in range(CLASSES):
        os.makedirs(os.path.join(folder, f"class_{c:03d}"), exist_ok=True)
    os.makedirs(shards, exist_ok=True)
    tar = None
    with Pool(2) as pool:
        for index, data in pool.imap(make, range(count), chunksize=64):
            label = index % CLASSES
            key = f"img_{index:06d}"
            with open(os.path.join(folder, f"class_{label:03d}", key + ".jpg"), "wb") as f:
                f.write(data)
            if index % PER_SHARD == 0:
                if tar is not None:
                    tar.close()
                tar = tarfile.open(os.path.join(shards, f"shard-{index // PER_SHARD:06d}.tar"), "w",
                                   format=tarfile.USTAR_FORMAT)
            for name, payload in ((key + ".jpg", data), (key + ".cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    tar.close()
    open(done, "w").close()


if __name__ == "__main__":
    main()

"""What PIL and torchvision 0.14 give, written to files for the C++ image tests to compare with.

    /usr/bin/python3 tests/python/torchvision_reference.py decode <out_dir>
    /usr/bin/python3 tests/python/torchvision_reference.py transforms <out_dir>

decode: encoded test images (JPEG 4:2:0/4:4:4/progressive/gray, PNG RGB/RGBA/gray/palette,
WebP lossy/lossless/alpha) and PIL's convert("RGB") and convert("L") pixels of each, raw HWC uint8
(<name>.rgb, <name>.l); manifest.txt lists "<file> <width> <height>".
transforms: input.rgb (HWC uint8, its size in manifest.txt), input.jpg (the same, as JPEG) and torchvision's tensor-path output
of each deterministic transform on it, raw little-endian (uint8 or float32, CHW), one line per
output in manifest.txt: "<name> <dtype> <c> <h> <w>"; rrc_params.i32 holds 20,000 draws of
RandomResizedCrop.get_params (top, left, height, width) on a 300x250 (HxW) image;
colorjitter_params.f64 20,000 draws of ColorJitter(0.4, 0.6, 1.5, 0.1).get_params (the order of
its four adjustments, then the brightness, contrast and saturation factors and the hue shift).
Not a test itself (pytest does not collect it).
"""
import os
import sys

import numpy as np
from PIL import Image


def test_image(width, height, seed):
    """Gradients, a disc and noise: content that exercises chroma, edges and smooth areas."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.zeros((height, width, 3), np.float64)
    img[..., 0] = 255 * x / max(width - 1, 1)
    img[..., 1] = 255 * y / max(height - 1, 1)
    img[..., 2] = 128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0)
    disc = (x - width / 3) ** 2 + (y - height / 2) ** 2 < (min(width, height) / 4) ** 2
    img[disc] = [250, 30, 60]
    img += rng.normal(0, 12, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_decode(out):
    rgb = Image.fromarray(test_image(67, 45, 1))
    rgba = rgb.copy()
    rgba.putalpha(Image.fromarray(test_image(67, 45, 2)[..., 0]))
    files = {
        "rgb420.jpg": lambda p: rgb.save(p, quality=90),
        "rgb444.jpg": lambda p: rgb.save(p, quality=95, subsampling=0),
        "progressive.jpg": lambda p: rgb.save(p, quality=85, progressive=True),
        "gray.jpg": lambda p: rgb.convert("L").save(p, quality=90),
        "rgb.png": lambda p: rgb.save(p),
        "rgba.png": lambda p: rgba.save(p),
        "gray.png": lambda p: rgb.convert("L").save(p),
        "palette.png": lambda p: rgb.convert("P", palette=Image.ADAPTIVE, colors=32).save(p),
        "lossy.webp": lambda p: rgb.save(p, quality=80),
        "lossless.webp": lambda p: rgb.save(p, lossless=True),
        "alpha.webp": lambda p: rgba.save(p, lossless=True),
    }
    with open(os.path.join(out, "manifest.txt"), "w") as manifest:
        for name, save in files.items():
            path = os.path.join(out, name)
            save(path)
            with Image.open(path) as im:
                im.load()
                np.asarray(im.convert("RGB")).tofile(path + ".rgb")
                np.asarray(im.convert("L")).tofile(path + ".l")
                manifest.write(f"{name} {im.width} {im.height}\n")
    # A big JPEG for the crop-window decode (several iMCU rows and columns, odd size).
    big = Image.fromarray(test_image(203, 157, 3))
    big.save(os.path.join(out, "big.jpg"), quality=90)


def write_transforms(out):
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F

    torch.manual_seed(0)
    hwc = test_image(61, 83, 4)  # W=61, H=83: odd, neither a multiple of 8
    hwc.tofile(os.path.join(out, "input.rgb"))
    Image.fromarray(hwc).save(os.path.join(out, "input.jpg"), quality=90)
    img = torch.from_numpy(hwc).permute(2, 0, 1).contiguous()  # CHW uint8, the tensor path
    as_float = img.to(torch.float32).div(255)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    outputs = {
        "resize_short_40": F.resize(img, [40], antialias=True),
        "resize_33x50": F.resize(img, [33, 50], antialias=True),
        "resize_up_150x120": F.resize(img, [150, 120], antialias=True),
        "resize_float_33x50": F.resize(as_float, [33, 50], antialias=True),
        "center_crop_30x20": F.center_crop(img, [30, 20]),
        "center_crop_90x70": F.center_crop(img, [90, 70]),
        "pad4_crop": F.crop(F.pad(img, [4, 4, 4, 4], fill=0, padding_mode="constant"), 3, 5, 60, 50),
        "pad_fill_crop": F.crop(F.pad(img, [2, 3, 4, 5], fill=7), 0, 0, 88, 66),
        "hflip": F.hflip(img),
        "resized_crop": F.resized_crop(img, 10, 7, 50, 40, [24, 24], antialias=True),
        "brightness_1.3": F.adjust_brightness(img, 1.3),
        "brightness_0.45": F.adjust_brightness(img, 0.45),
        "contrast_0.6": F.adjust_contrast(img, 0.6),
        "contrast_1.8": F.adjust_contrast(img, 1.8),
        "saturation_1.7": F.adjust_saturation(img, 1.7),
        "saturation_0.2": F.adjust_saturation(img, 0.2),
        "hue_0.2": F.adjust_hue(img, 0.2),
        "hue_-0.35": F.adjust_hue(img, -0.35),
        "to_tensor": as_float,
        "normalize": F.normalize(as_float, mean, std),
        "brightness_float_1.3": F.adjust_brightness(as_float, 1.3),
        "contrast_float_0.6": F.adjust_contrast(as_float, 0.6),
    }
    with open(os.path.join(out, "manifest.txt"), "w") as manifest:
        manifest.write(f"input uint8 3 {hwc.shape[0]} {hwc.shape[1]}\n")
        for name, t in outputs.items():
            t = t.contiguous()
            dtype = {torch.uint8: "uint8", torch.float32: "float32"}[t.dtype]
            t.numpy().tofile(os.path.join(out, name + ".bin"))
            manifest.write(f"{name} {dtype} {t.shape[0]} {t.shape[1]} {t.shape[2]}\n")
    rrc = T.RandomResizedCrop(224)
    probe = torch.zeros(3, 300, 250, dtype=torch.uint8)
    params = [rrc.get_params(probe, rrc.scale, rrc.ratio) for _ in range(20000)]
    np.asarray(params, np.int32).tofile(os.path.join(out, "rrc_params.i32"))
    jitter = T.ColorJitter(brightness=0.4, contrast=0.6, saturation=1.5, hue=0.1)
    rows = []
    for _ in range(20000):
        order, b, c, s, h = jitter.get_params(jitter.brightness, jitter.contrast,
                                              jitter.saturation, jitter.hue)
        rows.append([float(i) for i in order.tolist()] + [b, c, s, h])
    np.asarray(rows, np.float64).tofile(os.path.join(out, "colorjitter_params.f64"))


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    {"decode": write_decode, "transforms": write_transforms}[mode](out)

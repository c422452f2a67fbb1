#!/usr/bin/env python3
"""Writes the plain_png fuzzer's seeds (tests/fuzz/corpus/plain_png/) with the standard library
alone, so that each seed uses exactly the filters it names: every color type the fast path
takes (gray, gray+alpha, RGB, RGBA), every row filter (row y uses filter y % 5), a stream split
over several IDAT chunks, a text chunk, and one with gAMA that the fast path must leave to
libpng.

  python3 tests/fuzz/make_png_corpus.py
"""
import os
import struct
import zlib

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "plain_png")
os.makedirs(out, exist_ok=True)


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def filtered(rows, bpp):
    prev = bytes(len(rows[0]))
    raw = b""
    for y, row in enumerate(rows):
        f = y % 5
        line = bytearray()
        for i, x in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            pred = [0, a, b, (a + b) // 2, paeth(a, b, c)][f]
            line.append((x - pred) & 0xFF)
        raw += bytes([f]) + bytes(line)
        prev = row
    return raw


def png(name, width, height, color_type, bpp, idat_parts=1, extra=b""):
    rows = [bytes((x * 37 + y * 91 + x * y * 13) & 0xFF for x in range(width * bpp))
            for y in range(height)]
    stream = zlib.compress(filtered(rows, bpp), 9)
    step = (len(stream) + idat_parts - 1) // idat_parts
    idat = b"".join(chunk(b"IDAT", stream[i:i + step]) for i in range(0, len(stream), step))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    with open(os.path.join(out, name), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + idat + chunk(b"IEND", b""))


png("gray_7x6.png", 7, 6, 0, 1)
png("gray_alpha_5x5.png", 5, 5, 4, 2)
png("rgb_6x5.png", 6, 5, 2, 3)
png("rgba_4x7.png", 4, 7, 6, 4)
png("rgb_three_idat_9x8.png", 9, 8, 2, 3, idat_parts=3)
png("gray_text_3x3.png", 3, 3, 0, 1, extra=chunk(b"tEXt", b"Comment\0seed"))
png("gray_gamma_4x4.png", 4, 4, 0, 1, extra=chunk(b"gAMA", struct.pack(">I", 100000)))

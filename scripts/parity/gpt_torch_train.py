#!/usr/bin/env python3
"""nanoGPT's CPU recipe in PyTorch, on crowdtrain's corpus and split, for the quality-parity
target: a GPT-2 (Hugging Face `GPT2LMHeadModel`, 4 layers, 4 heads, width 128, context 64,
dropout 0) trained 2,000 steps on batches of 12 windows drawn at random from the first nine
tenths of the embedded Shakespeare's characters; AdamW (lr 1e-3, β 0.9/0.99, decay 0.1 on
the blocks' matrices as crowdtrain decays), 100 steps of warm-up then cosine decay to 1e-4,
the norm clipped at 1. The validation loss is the mean cross-entropy over the same windows
crowdtrain scores (the last tenth, windows of 65 every 64 tokens, at most 256 of them).

    python scripts/parity/gpt_torch_train.py [--steps 2000] [--threads 2] [--seed 1337]

Prints one JSON line per evaluation (`seconds` since the start, `train_seconds` without the
evaluations) and a last one with the totals.
"""
import argparse
import gzip
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2000)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=1337)
p.add_argument("--eval-every", type=int, default=250)
a = p.parse_args()
torch.manual_seed(a.seed)
torch.set_num_threads(a.threads)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
with gzip.open(os.path.join(ROOT, "data", "shakespeare8.txt.gz"), "rt", encoding="utf-8") as f:
    text = f.read()
chars = sorted(set(text))  # crowdtrain's character tokeniser: code point order
index = {c: i for i, c in enumerate(chars)}
ids = torch.tensor([index[c] for c in text], dtype=torch.long)
split = len(ids) - len(ids) // 10
train, test = ids[:split], ids[split:]
CONTEXT, BATCH = 64, 12
width = CONTEXT + 1
all_test = list(range(0, len(test) - width + 1, CONTEXT))
keep = min(len(all_test), 256)
val = torch.stack([test[all_test[i * len(all_test) // keep]:][:width] for i in range(keep)])

config = GPT2Config(vocab_size=len(chars), n_positions=CONTEXT, n_embd=128, n_layer=4, n_head=4,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
model = GPT2LMHeadModel(config)
named = list(model.transformer.named_parameters())
decays = lambda n: n.startswith("h.") and n.endswith(".weight") and ".ln_" not in n
opt = torch.optim.AdamW([{"params": [p for n, p in named if decays(n)], "weight_decay": 0.1},
                         {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.99), eps=1e-8)


def lr_at(it, lr=1e-3, min_lr=1e-4, warmup=100, decay=2000):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it >= decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def loss_of(batch):
    logits = model(batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


@torch.no_grad()
def validation():
    return sum(loss_of(val[i:i + 32]).item() * len(val[i:i + 32]) for i in range(0, len(val), 32)) / len(val)


start = time.perf_counter()
validating = 0.0  # seconds spent on evaluations, left out of train_seconds
for it in range(a.steps):
    for group in opt.param_groups:
        group["lr"] = lr_at(it, decay=a.steps)
    starts = torch.randint(0, len(train) - width + 1, (BATCH,))
    batch = torch.stack([train[s:s + width] for s in starts])
    loss = loss_of(batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if (it + 1) % a.eval_every == 0:
        began = time.perf_counter()
        val_loss = validation()
        validating += time.perf_counter() - began
        now = time.perf_counter() - start
        print(json.dumps({"step": it + 1, "train_loss": round(loss.item(), 4), "val_loss": round(val_loss, 4),
                          "seconds": round(now, 1), "train_seconds": round(now - validating, 2)}), flush=True)
seconds = time.perf_counter() - start
print(json.dumps({"framework": f"torch {torch.__version__}", "threads": a.threads, "steps": a.steps,
                  "val_loss": round(validation(), 4), "seconds": round(seconds, 1),
                  "tokens_per_s": round(a.steps * BATCH * CONTEXT / seconds)}))

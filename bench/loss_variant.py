"""Probe: the 1B step with head + fp32 cross-entropy eager (as the package) vs compiled into one graph."""
import time

import torch
import torch.nn.functional as F

from bench.step_overhead import build
from contract.hyperparameters import TrainConfig
from training.meter import honest_flops_per_sample

d = torch.device("cuda")
cfg = TrainConfig(model="gpt", model_size="1b", seq_len=2048, micro_batch_size=8, precision="bf16", compile=True,
                  max_steps=10**6, warmup_steps=0, data="synthetic")
m = build(cfg, d)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)


@torch.compile
def head_loss(h, y):
    return F.cross_entropy(m.head(m.ln_f(h)).flatten(0, -2).float(), y.flatten())


def trunk(idx):
    x = m.tok(idx) + m.pos(torch.arange(idx.shape[1], device=d))
    for b in m.blocks:
        x = b(x)
    return x


x = torch.randint(0, m.c.vocab_size, (8, 2049), device=d)
flops = honest_flops_per_sample(m, 2048) * 8


def step(compiled_loss):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if compiled_loss:
            loss = head_loss(trunk(x[:, :-1]), x[:, 1:])
        else:
            loss = F.cross_entropy(m(x[:, :-1]).flatten(0, -2).float(), x[:, 1:].flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


for compiled in (False, True, False, True):
    for _ in range(3):
        step(compiled)
    ts = []
    for _ in range(8):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step(compiled)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    best = min(ts)
    print(f"{'head+loss compiled' if compiled else 'head+loss eager (package)':<28} best {best * 1e3:.1f} ms  "
          f"{8 * 2048 / best:.0f} tokens/s  honest MFU {flops / best / 989e12:.1%}", flush=True)

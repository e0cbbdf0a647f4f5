"""Probe: where the 1B compiled step's loss is computed. One model, one batch, variants alternating:

    eager loss          blocks compiled, head and fp32 cross-entropy eager (the package before)
    compiled loss       + the fp32 cross-entropy compiled (training.step with compile)
    compiled head+loss  + ln_f, head and cross-entropy compiled into one graph (needs the model's hidden states)

    python -m bench.loss_variant            # one GPU
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from bench.step_overhead import build
from contract.hyperparameters import TrainConfig
from training.loss import full_cross_entropy as loss_fn
from training.metrics.flops import honest_flops_per_sample
from training.metrics.logger import peak_flops


def main() -> None:
    d = torch.device("cuda")
    cfg = TrainConfig(model="gpt", model_size="1b", seq_len=2048, micro_batch_size=8, precision="bf16", compile=True,
                      max_steps=10**6, warmup_steps=0, data="synthetic")
    m = build(cfg, d)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    compiled_loss = torch.compile(loss_fn)

    @torch.compile
    def head_loss(h, y):
        return F.cross_entropy(m.head(m.ln_f(h)).flatten(0, -2).float(), y.flatten())

    def trunk(idx):
        x = m.tok(idx) + m.pos(torch.arange(idx.shape[1], device=d))
        for b in m.blocks:
            x = b(x)
        return x

    x = torch.randint(0, m.c.vocab_size, (8, 2049), device=d)
    variants = {
        "eager loss": lambda: loss_fn(m(x[:, :-1]), x[:, 1:]),
        "compiled loss": lambda: compiled_loss(m(x[:, :-1]), x[:, 1:]),
        "compiled head+loss": lambda: head_loss(trunk(x[:, :-1]), x[:, 1:]),
    }

    def step(forward) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for forward in variants.values():  # compile and warm each
        for _ in range(3):
            step(forward)
    times = {name: [] for name in variants}
    for _ in range(10):  # alternating, so drift hits every variant alike
        for name, forward in variants.items():
            times[name].append(step(forward))
    flops, peak = honest_flops_per_sample(m) * 8, peak_flops(torch.cuda.get_device_name())
    for name, ts in times.items():
        best, med = min(ts), sorted(ts)[len(ts) // 2]
        print(f"{name:<20} best {best * 1e3:.1f} ms  median {med * 1e3:.1f} ms  {8 * 2048 / best:.0f} tokens/s  "
              f"honest MFU {flops / best / peak:.1%}", flush=True)


if __name__ == "__main__":
    main()

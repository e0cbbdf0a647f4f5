"""Pipeline stages cut by work (training FLOPs per token, the package's split) against a cut by parameter count.

    .venv/bin/python -m bench.pipeline_balance [--size 125m] [--stages 2] [--batch 4] [--seq-len 256] [--repeats 3]

For each cut of the gpt preset (training.parallel.pipeline_parallel.balance), times the forward and backward of every stage on
its own, in one process (the loss on the last), alternating the two cuts so that drift hits both alike. A
pipeline's steady state runs at the pace of its slowest stage, so the figure to compare is the bottleneck
(the slowest stage's median). CPU or one GPU: every stage runs on the same device, one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from contract.hyperparameters import TrainConfig
from contract.pipeline_cut import balance
from training.models import build_model, materialize
from training.parallel.pipeline_parallel import part, stage_weights


def parameter_cut(model, n_stages: int) -> list[range]:
    """The cut by parameter count: what the package did before it weighed stages by FLOPs."""
    size = lambda parts: sum(p.numel() for x in parts if x is not None for p in x.parameters())  # noqa: E731
    before, after = model.pipeline_edges
    return balance([size([b]) for b in model.blocks], n_stages,
                   size([getattr(model, n) for n in before]), size([getattr(model, n) for n in after]))


def stage_seconds(model, cut: list[range], x: torch.Tensor, y: torch.Tensor, device: torch.device) -> list[float]:
    """Seconds of each stage's forward and backward, fed the previous stage's output."""
    times, h = [], x
    for s, blocks in enumerate(cut):
        stage = part(model, blocks, s == 0, s == len(cut) - 1)
        inp = h if s == 0 else h.detach().requires_grad_()
        sync(device)
        t = time.perf_counter()
        out = stage(inp)
        if s == len(cut) - 1:
            F.cross_entropy(out.flatten(0, 1).float(), y.flatten()).backward()
        else:
            out.backward(torch.ones_like(out))
        sync(device)
        times.append(time.perf_counter() - t)
        h = out.detach()
    model.zero_grad(set_to_none=True)
    return times


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="125m", help="gpt preset")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(TrainConfig(model="gpt", model_size=args.size, seq_len=args.seq_len, data="synthetic"), {})
    materialize(model, device, 0)
    weights, first, last = stage_weights(model)
    cuts = {"by FLOPs (package)": balance(weights, args.stages, first, last),
            "by parameters": parameter_cut(model, args.stages)}
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.c.vocab_size, (args.batch, args.seq_len + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    for cut in cuts.values():  # warm-up: allocator, kernels
        stage_seconds(model, cut, x, y, device)
    runs = {name: [] for name in cuts}
    for _ in range(args.repeats):
        for name, cut in cuts.items():
            runs[name].append(stage_seconds(model, cut, x, y, device))
    name_dev = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name_dev}   model: gpt/{args.size}   {args.stages} stages   batch {args.batch} x {args.seq_len}")
    bottleneck = {}
    for name, cut in cuts.items():
        medians = [statistics.median(r[s] for r in runs[name]) for s in range(args.stages)]
        bottleneck[name] = max(medians)
        print(f"{name:<20} blocks {'/'.join(str(len(r)) for r in cut):<12} stage ms "
              f"{' / '.join(f'{t * 1000:.0f}' for t in medians):<24} bottleneck {max(medians) * 1000:.0f} ms")
    a, b = bottleneck.values()
    print(f"slowest stage, FLOP cut against parameter cut: {a / b - 1:+.1%} (median of {args.repeats})")


if __name__ == "__main__":
    main()

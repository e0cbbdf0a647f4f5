"""Peak GPU memory of the training package's step on one GPU, in the form of the planner's calibration rows
(jobs.planning.memory.CALIBRATION: (model, size, micro-batch, activation checkpointing) -> peak allocated GiB).

Each row runs the package's own step (bench.step_overhead.package_step: the single strategy, bf16 autocast, fp32
weights, fused AdamW, the package's loss) on a fixed batch: a warm-up step creates the optimizer state, then the
peak is reset and taken over the next steps (the steady state a long run lives in). tests/jobs/
test_planner_memory.py holds the planner to these figures within 10%. To re-measure the calibration rows:

    python -m bench.peak_memory gpt:1b:8 gpt:1b:8:ac gpt:350m:16 vit:base:256 vit:large:128

(tests/jobs/test_planner_memory.py checks this command names exactly CALIBRATION's rows.) Paste the printed
lines into CALIBRATION with the GPU, torch version and date. On a CPU it runs and says there is no peak to read
(`python -m bench.peak_memory gpt:tiny:2` checks the harness).

The rows were measured with the whole fp32 loss (training.loss.full_cross_entropy, the package's only loss then), and
the planner evaluates them with it: the bench runs it too unless `--loss-chunk-tokens N` asks for the chunked loss
(the package's default now, 1024; what the planner then charges is jobs.planning.memory's `loss_bytes`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from bench.step_overhead import fixed_batch, package_step, sync
from contract.hyperparameters import TrainConfig
from contract.models import PRESETS
from training.precision import resolve_precision

GIB = 2 ** 30


@dataclass(frozen=True)
class Row:
    model: str
    size: str
    micro: int
    checkpointing: bool

    @classmethod
    def parse(cls, text: str) -> Row:
        """`model:size:micro[:ac]`, e.g. gpt:1b:8:ac."""
        parts = text.split(":")
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "ac") or not parts[2].isdigit():
            raise ValueError(f"{text!r}: write model:size:micro-batch, and :ac for activation checkpointing "
                             "(e.g. gpt:1b:8:ac)")
        model, size = parts[0], parts[1]
        if size not in PRESETS.get(model, {}):
            raise ValueError(f"{text!r}: {model}:{size} is not a preset of contract.models")
        return cls(model, size, int(parts[2]), len(parts) == 4)

    def key(self) -> tuple[str, str, int, bool]:
        return (self.model, self.size, self.micro, self.checkpointing)


def peak_gib(row: Row, device: torch.device, steps: int = 3, loss_chunk_tokens: int = 0) -> float | None:
    """Peak allocated GiB over `steps` steady steps of the package's step; None where the device keeps no count."""
    cfg = TrainConfig(model=row.model, model_size=row.size, micro_batch_size=row.micro, precision="bf16",
                      activation_checkpointing=row.checkpointing, max_steps=10 ** 6, warmup_steps=0,
                      data="synthetic", loss_chunk_tokens=loss_chunk_tokens)
    step = package_step(cfg, device, resolve_precision(cfg.precision, device))
    x, y = fixed_batch(step.par.model, row.micro, device)
    step([(x, y)])  # creates the optimizer state
    sync(device)
    if device.type != "cuda":
        for _ in range(steps):
            step([(x, y)])
        return None
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        step([(x, y)])
    sync(device)
    peak = torch.cuda.max_memory_allocated(device) / GIB
    del step, x, y
    torch.cuda.empty_cache()
    return peak


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="model:size:micro-batch[:ac], e.g. gpt:1b:8:ac")
    p.add_argument("--steps", type=int, default=3, help="steady steps the peak is taken over")
    p.add_argument("--loss-chunk-tokens", type=int, default=0,
                   help="the loss's chunk (0, the default: the whole fp32 loss the calibration rows were measured with)")
    args = p.parse_args(argv)
    try:
        rows = [Row.parse(text) for text in args.rows]
    except ValueError as exc:
        p.error(str(exc))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    loss = f"loss in chunks of {args.loss_chunk_tokens} tokens" if args.loss_chunk_tokens else "whole fp32 loss"
    print(f"# {name}, torch {torch.__version__}, bf16 autocast, fp32 weights, fused AdamW, {loss}: peak allocated GiB")
    for row in rows:
        peak = peak_gib(row, device, args.steps, args.loss_chunk_tokens)
        print(f"    {row.key()!r}: {peak:.2f}," if peak is not None else
              f"    {row.key()!r}: ran {args.steps} steps on the CPU; no peak to read (run it on a GPU)")


if __name__ == "__main__":
    main()

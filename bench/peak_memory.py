"""Peak memory of the training package's step on one device, in the form of the planner's calibration rows
(jobs.planning.memory.CALIBRATION: (model, size, micro-batch, checkpointing policy) -> peak allocated GiB).

Each row runs the package's own step (bench.step_overhead.package_step: the single strategy, bf16 autocast, fp32
weights, AdamW, the package's loss) on a fixed batch: a warm-up step creates the optimizer state, then the peak is
taken over the next steps (the steady state a long run lives in). tests/jobs/test_planner_memory.py holds the
planner to these figures. To re-measure the calibration rows on a GPU:

    python -m bench.peak_memory gpt:1b:8 gpt:1b:8:ac gpt:350m:16 vit:base:256 vit:large:128

(tests/jobs/test_planner_memory.py checks this command names exactly CALIBRATION's rows.) Paste the printed
lines into CALIBRATION with the GPU, torch version and date. A row ends in `:ac` for full activation checkpointing,
`:sac` for selective (per op).

On a CPU the peak is read from the allocator's running total as torch.profiler records it, over the forward and
backward (the CPU's AdamW is the unfused one, whose temporaries a GPU's fused step does not make), plus the state
held before the step: the same quantity as a GPU's max_memory_allocated wherever the peak is in forward or
backward. `python -m bench.peak_memory gpt:small:8 gpt:small:8:ac gpt:small:8:sac` runs in seconds.

The rows were measured with the whole fp32 loss (training.loss.full_cross_entropy, the package's only loss then), and
the planner evaluates them with it: the bench runs it too unless `--loss-chunk-tokens N` asks for the chunked loss
(the package's default now, 1024; what the planner then charges is jobs.planning.memory's `loss_bytes`).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.step_overhead import fixed_batch, package_step, sync
from contract.hyperparameters import TrainConfig
from contract.models import PRESETS
from training.precision import resolve_precision

GIB = 2 ** 30
POLICIES = {"ac": "full", "sac": "selective"}  # a row's suffix -> contract.hyperparameters' checkpointing policy


@dataclass(frozen=True)
class Row:
    model: str
    size: str
    micro: int
    policy: str | None  # None: no activation checkpointing
    every: int = 1  # activation_checkpointing_every (not in the row's text: the calibration rows checkpoint all)

    @classmethod
    def parse(cls, text: str) -> Row:
        """`model:size:micro[:ac|:sac]`, e.g. gpt:1b:8:ac."""
        parts = text.split(":")
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] not in POLICIES) or not parts[2].isdigit():
            raise ValueError(f"{text!r}: write model:size:micro-batch, and :ac for full activation checkpointing or "
                             ":sac for selective (e.g. gpt:1b:8:ac)")
        model, size = parts[0], parts[1]
        if size not in PRESETS.get(model, {}):
            raise ValueError(f"{text!r}: {model}:{size} is not a preset of contract.models")
        return cls(model, size, int(parts[2]), POLICIES[parts[3]] if len(parts) == 4 else None)

    def key(self) -> tuple[str, str, int, str | None]:
        return (self.model, self.size, self.micro, self.policy)


def train_config(row: Row, loss_chunk_tokens: int = 0, seq_len: int | None = None) -> TrainConfig:
    return TrainConfig(model=row.model, model_size=row.size, micro_batch_size=row.micro, precision="bf16",
                       activation_checkpointing=row.policy is not None,
                       activation_checkpointing_policy=row.policy or "full",
                       activation_checkpointing_every=row.every, seq_len=seq_len, max_steps=10 ** 6,
                       warmup_steps=0, data="synthetic", loss_chunk_tokens=loss_chunk_tokens)


def peak_gib(row: Row, device: torch.device, steps: int = 3, loss_chunk_tokens: int = 0, seq_len: int | None = None,
             data_meta: dict | None = None) -> float:
    """Peak allocated GiB over `steps` steady steps of the package's step (on a CPU: over one step's forward and
    backward, see the module's docstring). `seq_len` and `data_meta` ({"vocab_size": ...}) reshape the preset."""
    cfg = train_config(row, loss_chunk_tokens, seq_len)
    step = package_step(cfg, device, resolve_precision(cfg.precision, device), data_meta)
    x, y = fixed_batch(step.par.model, row.micro, device)
    step([(x, y)])  # creates the optimizer state
    sync(device)
    if device.type != "cuda":
        return (_state_bytes(step) + _forward_backward_peak(functools.partial(step, [(x, y)]))) / GIB
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        step([(x, y)])
    sync(device)
    peak = torch.cuda.max_memory_allocated(device) / GIB
    del step, x, y
    torch.cuda.empty_cache()
    return peak


def _state_bytes(step) -> int:
    """What a step starts with: the weights and the optimizer's state (zero_grad frees the gradients)."""
    tensors = [*step.par.model.parameters(),
               *(t for s in step.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


def _forward_backward_peak(run_step) -> int:
    """The most bytes a CPU step allocates above what it starts with, before its optimizer step: the running total
    of torch.profiler's memory events (it counts from the profiler's start)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_step()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    optimizer = min(e["ts"] for e in events if str(e.get("name", "")).startswith("Optimizer.step"))
    return max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]" and e["ts"] < optimizer)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="model:size:micro-batch[:ac|:sac], e.g. gpt:1b:8:ac")
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
    print(f"# {name}, torch {torch.__version__}, bf16 autocast, fp32 weights, AdamW, {loss}: peak allocated GiB")
    for row in rows:
        print(f"    {row.key()!r}: {peak_gib(row, device, args.steps, args.loss_chunk_tokens):.2f},", flush=True)


if __name__ == "__main__":
    main()

"""The conformance matrix's runs: every parallel layout x every feature that changes the math, each against one
process on the same global batch (tests/training/test_conformance.py asserts; this module runs).

A cell is (layout, feature). Its run trains 4 SGD steps with clipping active, saving at step 2; a second run
resumes from a copy of that step-2 checkpoint (a new process group and model, as after a stop). An observer (training.step.TrainStep.observe) gathers, on every
step, the whole model's gradient before and after clipping and its weights after the update, from every rank:
DTensors made whole, DDP's and the activation-checkpointing wrapper's prefixes taken off, a pipeline's stages
united. Where several ranks hold the same parameter (replicas, a tensor group's replicated norms) the largest
difference between their copies is kept too: replicated state that drifts apart is a bug of its own.

Every cell of one world size runs in one spawn (starting processes and process groups is the expensive part).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor

from tests.training.helpers import config, free_port, start_ranks

STEPS, SAVED_AT = 4, 2
# Clipping is active in every cell (the gradient norm of this model and data is 1-3 at these steps).
CLIP = 0.05
BASE = dict(optimizer="sgd", lr=0.5, weight_decay=0.0, grad_clip=CLIP, lr_schedule="constant", warmup_steps=0,
            max_steps=STEPS, checkpoint_interval=SAVED_AT, keep_checkpoints=2, log_interval=1, eval_interval=0,
            precision="fp32", model="tests.training.parallel.test_parallel_models:gpt4",
            # The package's chunked loss, in chunks that split every rank's micro-batch (16 tokens a sample) at
            # other places than one process's pooled batch: each cell checks its sum against one process too.
            loss_chunk_tokens=5)
PP = {"pp_microbatches": 2}  # divides the pooled batch of every pipeline cell, accumulation included

# name -> (world size, hyperparameters)
LAYOUTS: dict[str, tuple[int, dict]] = {
    "ddp": (2, {"strategy": "ddp"}),
    "fsdp": (2, {"strategy": "fsdp"}),
    "tp_sp": (2, {"strategy": "tp", "tp_degree": 2}),  # sequence parallel: the probe passes at 16 tokens / 2
    "tp": (2, {"strategy": "tp", "tp_degree": 2, "model": "tests.training.parallel.test_parallel_models:gpt4_no_sp"}),
    "pp_1f1b": (2, {"strategy": "pp", "pp_degree": 2, **PP}),
    "pp_interleaved": (2, {"strategy": "pp", "pp_degree": 2, "pp_schedule": "interleaved_1f1b", **PP}),
    "pp_gpipe": (2, {"strategy": "pp", "pp_degree": 2, "pp_schedule": "gpipe", **PP}),
    # FSDP's two ways to accumulate (fsdp_accumulation) each hold in the accumulation cell: sharded (the default) in
    # fsdp, unsharded in these two (a pipeline's schedule handles its own micro-batches' gradients).
    "hsdp": (4, {"strategy": "hsdp", "dp_shard": 2, "fsdp_accumulation": "unsharded"}),  # 2 replicas x 2 shards
    "tp_dp": (4, {"strategy": "tp", "tp_degree": 2, "fsdp_accumulation": "unsharded"}),  # 2 tensor x 2 FSDP shards
    "pp_dp": (4, {"strategy": "pp", "pp_degree": 2, **PP}),  # 2 stages x 2 FSDP shards
    "hybrid": (4, {"strategy": "hybrid", "pp_degree": 2, "tp_degree": 2, **PP}),  # 2 stages x 2 tensor ranks
}

# name -> hyperparameters over BASE (micro-batch 2 per rank unless the feature says otherwise). Gradient
# accumulation and activation checkpointing share a cell: both fp32, both compared with one process doing the same,
# each a change of the math that would show in the other's company (and their interaction is checked too); one
# cell fewer per layout is 22 runs fewer of the matrix's 110 (the matrix is the largest part of `make test`).
FEATURES: dict[str, dict] = {
    "accumulation_checkpointing": {"micro_batch_size": 1, "grad_accum": 2, "activation_checkpointing": True},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "dropout": {"dropout": 0.1},
}
# Dropout draws other masks in another layout: those cells are checked on their own (replicas agree, the
# norm is the gradient's, clipping scales every gradient, the resume is exact), not against one process.
UNMATCHED = {"dropout"}


def cell_config(root: Path, corpus: Path, layout: str | None, feature: str, world: int, model: str | None = None):
    """The cell's TrainConfig; layout None: the one process with the same global batch (of `model`, default
    the matrix's)."""
    hps = {"micro_batch_size": 2, **BASE, **FEATURES[feature]}
    if layout is None:
        hps.update(strategy="single", micro_batch_size=hps["micro_batch_size"] * world, model=model or BASE["model"])
    else:
        hps.update(LAYOUTS[layout][1])
    return config(root, corpus, **hps)


def _clean(name: str) -> str:
    """The parameter's name in the model: without DDP's `module.` and the wrappers' own levels."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name.removeprefix("module.")


def _whole(model: torch.nn.Module, grads: bool) -> tuple[dict[str, torch.Tensor], float]:
    """Every parameter (or gradient) of the model, whole, on every rank; and the spread between copies."""
    local = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None:
            continue
        t = t.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        local[_clean(name)] = t.float().cpu().clone()
    if not torch_dist.is_initialized():
        return local, 0.0
    everyone = [None] * torch_dist.get_world_size()
    # As numpy arrays: pickled as raw bytes, where each tensor would be rebuilt through torch.load's storage
    # machinery on every receiving rank (that unpickling was the observer's largest cost; same float32 values).
    torch_dist.all_gather_object(everyone, {k: v.numpy() for k, v in local.items()})
    merged, spread = {}, 0.0
    for part in everyone:
        for k, v in part.items():
            if k in merged:
                spread = max(spread, float(np.abs(merged[k] - v).max()))
            else:
                merged[k] = v
    return {k: torch.from_numpy(v) for k, v in merged.items()}, spread


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if isinstance(t, DTensor) else t).detach()


class Observer:
    """Per step: the true norm of the whole gradient, each parameter's clip ratio (on every rank's local part:
    a part clipping missed keeps ratio 1), the weights, and the spreads between copies."""

    def __init__(self) -> None:
        self.steps: dict[int, dict] = {}
        self._record: dict = {}
        self._before: dict[str, torch.Tensor] = {}

    def __call__(self, event: str, step) -> None:
        named = [(_clean(n), p) for n, p in step.model.named_parameters() if p.grad is not None]
        if event == "gradients":
            whole, spread = _whole(step.model, grads=True)
            self._record = {"norm": sum(g.double().pow(2).sum() for g in whole.values()).sqrt().item(),
                            "grad_spread": spread}
            self._before = {n: _local(p.grad).double().clone() for n, p in named}
        elif event == "clipped":
            mine = {n: (_local(p.grad).double().norm() / self._before[n].norm()).item()
                    for n, p in named if self._before[n].abs().max() > 0}
            parts = [mine]
            if torch_dist.is_initialized():
                parts = [None] * torch_dist.get_world_size()
                torch_dist.all_gather_object(parts, mine)
            self._record["ratios"] = {f"{n}@{rank}": r for rank, part in enumerate(parts) for n, r in part.items()}
        elif event == "updated" and self._record:
            weights, spread = _whole(step.model, grads=False)
            n = step.scheduler.last_epoch  # optimizer steps taken, restored on resume
            self.steps[n] = {**self._record, "weights": weights, "weight_spread": spread}
            self._record = {}


def run_cell(root: Path, cfg, resume_from: Path | None) -> None:
    """Train one run of a cell; rank 0 writes what it observed to root/observed.pt. A resumed run is not
    observed: its losses and exported weights are compared with the uninterrupted run's."""
    from training.loop import train
    from training.parallel.process_group import setup
    from training.resilience.stop import StopFlag

    dist = setup(cfg)
    if resume_from is not None:
        if dist.is_main:
            shutil.copytree(resume_from, root / "checkpoints" / resume_from.name)
        dist.barrier()
    observer = Observer() if resume_from is None else None
    train(cfg, dist, StopFlag(), observe=observer)
    if dist.is_main and observer is not None:
        torch.save(observer.steps, root / "observed.pt")


def runs_for(world: int, root: Path, corpus: Path) -> list[tuple[Path, dict, Path | None]]:
    """(folder, config, checkpoint to resume from) of every run of this world size, in order."""
    runs = []
    for layout, (w, _) in LAYOUTS.items():
        if w != world:
            continue
        for feature in FEATURES:
            straight, resumed = root / f"{layout}-{feature}", root / f"{layout}-{feature}-resumed"
            cfg = cell_config(straight, corpus, layout, feature, world)
            runs.append((straight, vars(cfg), None))
            runs.append((resumed, vars(cell_config(resumed, corpus, layout, feature, world)),
                         straight / "checkpoints" / f"step-{SAVED_AT}"))
    return runs


def worker(rank: int, world: int, port: int, runs: list) -> None:
    import os

    from training.config import from_environment
    from training.parallel.process_group import teardown

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        for folder, values, resume_from in runs:
            run_cell(Path(folder), from_environment(values, {}), resume_from)
    finally:
        teardown()


def spawn_cells(world: int, root: Path, corpus: Path) -> None:
    start_ranks(worker, (world, free_port(), runs_for(world, root, corpus)), world)


def run_references(root: Path, corpus: Path) -> None:
    """The one process of every matched feature, with the global batch of 2 and of 4 ranks."""
    from training.parallel.process_group import teardown

    for world in sorted({w for w, _ in LAYOUTS.values()}):
        for feature in FEATURES:
            if feature in UNMATCHED:
                continue
            folder = root / f"single{world}-{feature}"
            try:
                run_cell(folder, cell_config(folder, corpus, None, feature, world), None)
            finally:
                teardown()


def observed(folder: Path) -> dict[int, dict]:
    return torch.load(folder / "observed.pt", weights_only=False)


def logged(folder: Path) -> dict[int, dict]:
    """The metric lines of a run by step (train_loss, grad_norm as the run logged them)."""
    lines = (folder / "output" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "train_loss" in r}


def measured(root: Path) -> dict[str, dict[str, float]]:
    """The largest differences the matrix saw, by precision: against one process (loss, norm relative, weights)
    and within a run (logged norm against the gathered gradient's, clip ratios against the coefficient)."""
    out: dict[str, dict[str, float]] = {}
    for layout, (world, _) in LAYOUTS.items():
        for feature, hps in FEATURES.items():
            run = root / f"{layout}-{feature}"
            if not (run / "observed.pt").exists():
                continue
            seen, log = observed(run), logged(run)
            m = out.setdefault(hps.get("precision", BASE["precision"]) + ("" if feature not in UNMATCHED else
                                                                          f" ({feature})"), {})
            ref = root / f"single{world}-{feature}"
            for step, s in seen.items():
                norm = log[step]["grad_norm"]
                coef = min(1.0, CLIP / (norm + 1e-6))
                m["logged norm"] = max(m.get("logged norm", 0), abs(norm / s["norm"] - 1))
                m["clip ratio"] = max(m.get("clip ratio", 0), max(abs(r / coef - 1) for r in s["ratios"].values()))
                if feature in UNMATCHED or not (ref / "observed.pt").exists():
                    continue
                r_seen, r_log = observed(ref)[step], logged(ref)[step]
                m["loss"] = max(m.get("loss", 0), abs(log[step]["train_loss"] - r_log["train_loss"]))
                m["norm"] = max(m.get("norm", 0), abs(s["norm"] / r_seen["norm"] - 1))
                m["weights"] = max(m.get("weights", 0), max((s["weights"][k] - r_seen["weights"][k]).abs().max().item()
                                                            for k in s["weights"]))
    return out


def main() -> None:
    """`python -m tests.training.conformance [FOLDER]`: run the whole matrix and print the largest differences
    per precision (what test_conformance's tolerances are set from)."""
    import sys
    import tempfile
    import time

    from tests.training.helpers import write_corpus

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="conformance-"))
    corpus = write_corpus(root / "corpus")
    began = time.time()
    run_references(root, corpus)
    for world in sorted({w for w, _ in LAYOUTS.values()}):
        spawn_cells(world, root, corpus)
    print(f"{time.time() - began:.0f} s; torch {torch.__version__}, runs in {root}")
    for precision, m in measured(root).items():
        print(f"{precision:>16}: " + ", ".join(f"{k} {v:.2e}" for k, v in m.items()))


if __name__ == "__main__":
    main()

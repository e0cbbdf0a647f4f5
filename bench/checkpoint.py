"""Checkpoint save/restore cost of the package's models: synchronous DCP save against async saves.

Builds the model like bench/step_overhead.py (preset, meta init, the package's strategy and AdamW), takes one
real optimizer step so the AdamW state exists, then in one run writes the same state dict with:
  sync            dcp.save
  async default   dcp.async_save with its default staging (a fresh pageable CPU copy per save)
  pinned own      training.checkpoint.staging.PinnedStager(backend="own"): reused pinned buffers, side stream
  pinned torch    PinnedStager(backend="torch"): torch's DefaultStager, pinned + cached, staging synchronously
  torch bg-stage  DefaultStager with use_async_staging=True: the call returns at once, the copy runs in a thread;
                  the loop must wait for `staging_completion` before the optimizer next writes the parameters
The pinned variants save twice: the first save allocates and pins the buffers, the second is the steady state.
"stall" is how long the training loop is blocked (the call's return; for bg-stage, until staging completes),
"total" until the files are on disk. Then restore (dcp.load + set_state_dict) and the bytes on disk.

    python -m bench.checkpoint --size tiny                     # CPU, seconds
    python -m bench.checkpoint --model gpt --size 1b --dir /tmp/ckpt-bench
    python -m bench.checkpoint --size tiny --strategy fsdp     # DTensor state dict (one-rank FSDP2)
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from training.checkpoint.staging import PinnedStager, state_bytes, torch_stager_available
from training.config import TrainConfig
from training.models import build_model, count_params, materialize
from training.optim import build_optimizer
from training.parallel.process_group import Dist
from training.parallel.strategies import apply_strategy
from training.precision import resolve_precision


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt", choices=["gpt", "vit"])
    p.add_argument("--size", default="tiny")
    p.add_argument("--strategy", default="single", choices=["single", "fsdp"])
    p.add_argument("--dir", default="/tmp/ckpt-bench", help="scratch folder (emptied; needs ~2x the state)")
    p.add_argument("--budget-gib", type=float, default=None, help="PinnedStager host-memory budget")
    return p.parse_args(argv)


def start_device(strategy: str) -> torch.device:
    """The GPU if there is one; for fsdp, a one-rank process group (async_save needs a CPU backend in it)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    if strategy == "fsdp":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        torch_dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo", rank=0,
                                      world_size=1)
    return device


def build(args: argparse.Namespace, device: torch.device):
    """(cfg, dist, par, optimizer, dtype): the model as the package builds it (preset, meta init, strategy, AdamW)."""
    dist = Dist(rank=0, world_size=1, local_rank=0, device=device)
    cfg = TrainConfig(model=args.model, model_size=args.size, micro_batch_size=1, precision="auto",
                      strategy=args.strategy, max_steps=10, warmup_steps=0, data="synthetic")
    precision = resolve_precision(cfg.precision, device)
    model = build_model(cfg, {})
    materialize(model, device, cfg.seed)
    par = apply_strategy(model, cfg, dist, precision)
    return cfg, dist, par, build_optimizer(par.model, cfg), precision.param


def one_step(kind: str, par, optimizer, dtype: torch.dtype, device: torch.device) -> None:
    """One real step, so that AdamW's exp_avg / exp_avg_sq / step exist."""
    model, c = par.model, par.model.c
    if kind == "gpt":
        x = torch.randint(0, c.vocab_size, (1, min(128, c.seq_len)), device=device)
        y = torch.randint(0, c.vocab_size, x.shape, device=device)
    else:
        x = torch.randn(2, c.channels, c.image_size, c.image_size, device=device)
        y = torch.randint(0, c.num_classes, (2,), device=device)
    with torch.autocast(device.type, dtype=dtype, enabled=par.use_autocast and dtype != torch.float32):
        logits = model(x)
    F.cross_entropy(logits.flatten(0, -2).float(), y.flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(device)


class SaveTimer:
    """Times one save variant into `root/<label>` and keeps its row (variant, stall s, total s)."""

    def __init__(self, root: Path, device: torch.device) -> None:
        self.root, self.device = root, device
        self.rows: list[tuple[str, float, float]] = []

    def timed(self, label: str, fn) -> None:
        """fn(path) -> (stall seconds, future or None); total = until the write is on disk."""
        path = self.root / label.replace(" ", "-")
        sync(self.device)
        t0 = time.perf_counter()
        try:
            stall, future = fn(str(path))
            if future is not None:
                future.result()
        except Exception as e:  # one variant failing (a torch bug, say) must not lose the others
            print(f"  {label}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            self.rows.append((label + " FAILED", float("nan"), float("nan")))
            shutil.rmtree(path, ignore_errors=True)
            return
        total = time.perf_counter() - t0
        self.rows.append((label, stall, total))
        print(f"  {label}: stall {stall * 1e3:.1f} ms, total {total * 1e3:.1f} ms", flush=True)
        if label not in ("sync", "pinned own"):
            shutil.rmtree(path, ignore_errors=True)


def measure_sync(timer: SaveTimer, state: dict) -> int:
    """dcp.save; returns the bytes it wrote (its checkpoint is kept for the restore)."""
    def sync_save(path):
        t = time.perf_counter()
        dcp.save(state, checkpoint_id=path)
        return time.perf_counter() - t, None

    timer.timed("sync", sync_save)
    return du(timer.root / "sync")


def measure_restore(model, optimizer, checkpoint: Path, device: torch.device) -> float:
    """Seconds to restore `checkpoint` into the live (device) state dict: dcp.load + set_state_dict."""
    sync(device)
    t = time.perf_counter()
    target_model, target_optim = get_state_dict(model, optimizer)
    target = {"model": target_model, "optim": target_optim}
    dcp.load(target, checkpoint_id=str(checkpoint))
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    sync(device)
    return time.perf_counter() - t


def measure_async_default(timer: SaveTimer, state: dict) -> None:
    def default_async(path):
        t = time.perf_counter()
        f = dcp.async_save(state, checkpoint_id=path)
        return time.perf_counter() - t, getattr(f, "upload_completion", f)

    timer.timed("async default", default_async)


def measure_pinned(timer: SaveTimer, state: dict, budget_gib: float | None) -> None:
    """PinnedStager, each backend there is: the first save (allocates and pins), then the steady state."""
    budget = int(budget_gib * 2**30) if budget_gib is not None else None
    backends = ["own"] + (["torch"] if torch_stager_available() else [])
    for backend in backends:
        stager = PinnedStager(budget_bytes=budget, backend=backend)

        def run(path, stager=stager):
            t = time.perf_counter()
            f = stager.save(state, path)
            return time.perf_counter() - t, f

        timer.timed(f"pinned {backend} 1st", run)
        timer.timed(f"pinned {backend}", run)
        if stager.last_staged_sync:
            timer.rows[-1] = (timer.rows[-1][0] + " (over budget: sync)", *timer.rows[-1][1:])
        try:
            stager.close()
        except Exception as e:
            print(f"  close: {type(e).__name__}: {e}")


def measure_background_staging(timer: SaveTimer, state: dict, device: torch.device) -> None:
    """torch's DefaultStager with use_async_staging: the call returns, a thread copies (where torch has it)."""
    if not torch_stager_available():
        return
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    pin = device.type == "cuda"
    bg = DefaultStager(StagingOptions(use_pinned_memory=pin, use_shared_memory=False, use_async_staging=True,
                                      use_non_blocking_copy=pin))
    for label in ("torch bg-stage 1st", "torch bg-stage"):
        def run(path, label=label):
            t = time.perf_counter()
            r = dcp.async_save(state, checkpoint_id=path, async_stager=bg)
            returned = time.perf_counter() - t
            r.staging_completion.result()  # the loop must wait for this before optimizer.step
            staged = time.perf_counter() - t
            print(f"  {label}: call returned after {returned * 1e3:.1f} ms, staged after {staged * 1e3:.1f} ms")
            return staged, r.upload_completion
        timer.timed(label, run)
    try:
        bg.close()
    except Exception as e:
        print(f"  close: {type(e).__name__}: {e}")


def check_pinned_checkpoint(model_sd: dict, checkpoint: Path) -> None:
    """The steady-state pinned checkpoint must hold exactly the model's weights."""
    back = {"model": {k: torch.zeros_like(v) for k, v in model_sd.items()}}
    dcp.load(back, checkpoint_id=str(checkpoint))
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731
    bad = [k for k, v in back["model"].items() if not torch.equal(full(v), full(model_sd[k]))]
    print(f"pinned own checkpoint matches the model: {not bad} {bad[:3]}")


def print_report(args: argparse.Namespace, device: torch.device, model, nbytes: int, on_disk: int,
                 restore: float, rows: list[tuple[str, float, float]]) -> None:
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    t_sync = rows[0][2]
    print(f"device: {name}   torch {torch.__version__}   {args.model}/{args.size} {count_params(model) / 1e6:.1f}M "
          f"params, strategy {args.strategy}, AdamW state after 1 step")
    print(f"state to stage: {nbytes / 2**30:.2f} GiB   on disk: {on_disk / 2**30:.2f} GiB ({on_disk} bytes)   "
          f"restore (dcp.load + set_state_dict): {restore * 1e3:.1f} ms")
    print(f"{'variant':<24}{'stall ms':>11}{'total ms':>11}{'stall/sync':>12}{'write GB/s':>12}")
    for label, stall, total in rows:
        print(f"{label:<24}{stall * 1e3:>11.1f}{total * 1e3:>11.1f}{stall / t_sync:>12.1%}"
              f"{on_disk / total / 1e9:>12.2f}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = start_device(args.strategy)
    cfg, dist, par, optimizer, dtype = build(args, device)
    one_step(args.model, par, optimizer, dtype, device)
    model = par.model
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    nbytes = state_bytes(state)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    timer = SaveTimer(root, device)
    on_disk = measure_sync(timer, state)
    restore = measure_restore(model, optimizer, root / "sync", device)
    shutil.rmtree(root / "sync", ignore_errors=True)
    measure_async_default(timer, state)
    measure_pinned(timer, state, args.budget_gib)
    measure_background_staging(timer, state, device)
    timer.rows += manager_rows(cfg, dist, model, optimizer, root, device)
    check_pinned_checkpoint(model_sd, root / "pinned-own")

    print_report(args, device, model, nbytes, on_disk, restore, timer.rows)
    shutil.rmtree(root, ignore_errors=True)
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def manager_rows(cfg, dist, model, optimizer, root: Path, device) -> list:
    """The package's own path: CheckpointManager with async_checkpoint (PinnedStager inside), two saves:
    stall = save() returning to the loop, total = until wait() wrote the completion marker."""
    import dataclasses

    from training.checkpoint.manager import CheckpointManager
    from training.checkpoint.state import ModelState, OptimizerState

    mcfg = dataclasses.replace(cfg, checkpoint_dir=str(root / "manager"), async_checkpoint=True, keep_checkpoints=1)
    manager = CheckpointManager(mcfg, dist, {"model": ModelState(model), "optim": OptimizerState(model, optimizer)})
    rows = []
    for step, label in ((1, "manager async 1st"), (2, "manager async")):
        sync(device)
        t = time.perf_counter()
        manager.save(step)
        stall = time.perf_counter() - t
        manager.wait()
        rows.append((label, stall, time.perf_counter() - t))
    manager.save_final(2)
    return rows


if __name__ == "__main__":
    main()

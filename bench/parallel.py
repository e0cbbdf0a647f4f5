"""Step time and per-rank memory of each model-parallel strategy against FSDP alone, and the pipeline bubble.

    .venv/bin/python -m bench.parallel [--world 2|4] [--steps 8] [--layers 8] [--d-model 128]

Each strategy runs `world` gloo processes on this machine (CPU) through the training package's own
components (job, optimizer, TrainStep) on synthetic tokens with one global batch for all. Per rank: the
median step time, the bytes of parameters + gradients + optimizer state it holds (what sharding saves), and
its peak RSS. Pipeline bubble: 1 - t(one process, whole model) / (world x t(pipeline step)), against
(p - 1) / (v x m + p - 1) for 1F1B/GPipe (v = 1) and interleaved 1F1B (v = 2 stages per rank, and 4). CPU figures
only: the processes share the cores, so compute does not scale with ranks as on GPUs (with more ranks than
cores the measured bubble is mostly core sharing); compare memory freely and times within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

from contract.parallel import stages_per_rank

SHAPE = {"layers": 8, "d_model": 128}


def model(cfg, data_meta):
    from contract.models import GPTConfig
    from training.models.gpt import GPT

    return GPT(GPTConfig(n_layer=SHAPE["layers"], n_head=4, d_model=SHAPE["d_model"], seq_len=64, vocab_size=256))


def _state_bytes(model, optimizer) -> int:
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    total = sum(local(p).numel() * p.element_size() * 2 for p in model.parameters())  # + gradient
    for state in optimizer.state.values():
        total += sum(local(v).numel() * v.element_size() for v in state.values() if torch.is_tensor(v) and v.dim())
    return total


def _rank(rank: int, world: int, port: int, hps: dict, steps: int, shape: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    SHAPE.update(shape)
    from training.config import from_environment
    from training.data.loader import BatchSource
    from training.data.sampler import GlobalBatchSampler
    from training.job import build_job
    from training.optim import build_optimizer, build_scheduler
    from training.parallel.process_group import setup, teardown
    from training.step import TrainStep

    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_environment({"model": "bench.parallel:model", "data": "synthetic", "seq_len": 64,
                                "global_batch_size": 16, "micro_batch_size": 16 // world, "max_steps": steps,
                                "checkpoint_dir": tmp, "model_dir": tmp, "output_data_dir": tmp, **hps}, {})
        dist = setup(cfg)
        job = build_job(cfg, dist)
        optimizer = build_optimizer(job.model, cfg)
        step = TrainStep(job.par, optimizer, build_scheduler(optimizer, cfg), torch.amp.GradScaler("cpu", enabled=False),
                         job.precision, dist.device, cfg.grad_clip)
        # The loop's own data path (training.loop), without loader workers: the step is what is timed.
        sampler = GlobalBatchSampler(len(job.train_set), job.global_batch, job.data_rank, job.data_world, cfg.seed)
        source = BatchSource(job.train_set, sampler, cfg.micro_batch_size, dist.device, workers=0)
        times = []
        for _ in range(steps):
            batches = source.next()
            torch.distributed.barrier()
            t0 = time.perf_counter()
            step(batches)
            times.append(time.perf_counter() - t0)
        row = {"rank": rank, "step_ms": 1000 * statistics.median(times[2:]), "state_mb": _state_bytes(job.model, optimizer) / 2**20,
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        with open(f"{out}.{rank}", "w") as f:
            json.dump(row, f)
        del step, job, optimizer, source, batches  # the process groups they hold go with them, before teardown
        teardown()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, hps: dict, steps: int, shape: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(_rank, args=(world, free_port(), hps, steps, shape, out), nprocs=world, join=True)
        return [json.load(open(f"{out}.{r}")) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=128)
    a = ap.parse_args()
    shape = {"layers": a.layers, "d_model": a.d_model}
    w = a.world
    cases = {"fsdp": {"strategy": "fsdp"}, "hsdp": {"strategy": "hsdp", "dp_shard": 2},
             "tp": {"strategy": "tp", "tp_degree": 2}}
    for sched in ("1f1b", "interleaved_1f1b", "gpipe"):
        cases[f"pp_{sched}"] = {"strategy": "pp", "pp_degree": 2, "pp_schedule": sched}
    if a.layers % 8 == 0:  # 2 ranks x 4 stages a rank split the blocks equally
        cases["pp_interleaved_x4"] = {"strategy": "pp", "pp_degree": 2, "pp_schedule": "interleaved_1f1b",
                                      "pp_stages_per_rank": 4}
    if w == 4:
        cases["hybrid"] = {"strategy": "hybrid", "pp_degree": 2, "tp_degree": 2}
    one = run(1, {"strategy": "fsdp"}, a.steps, shape)[0]["step_ms"]
    print(f"world={w}, GPT {a.layers} layers x d_model {a.d_model}, global batch 16 x 64 tokens; "
          f"one process: {one:.1f} ms/step")
    print(f"{'strategy':22} {'step ms (max rank)':>18} {'state MB/rank (max)':>20} {'peak RSS MB (max)':>18}  bubble")
    for name, hps in cases.items():
        rows = run(w, hps, a.steps, shape)
        step_ms = max(r["step_ms"] for r in rows)
        bubble = ""
        if name.startswith("pp_"):
            # Idle fraction against the one-process step spread over all w ranks (p stages x w/p data ranks,
            # each pipeline on its 1/(w/p) of the batch). v stages per rank shrink the bubble (interleaving).
            p, m, v = 2, 2 * 2, stages_per_rank(hps["pp_schedule"], hps.get("pp_stages_per_rank"))
            measured = 1 - one / (w * step_ms)
            bubble = (f"measured {measured:.2f} vs (p-1)/(v*m+p-1) = {(p - 1) / (v * m + p - 1):.2f} "
                      f"(p={p}, v={v}, m={m})")
        print(f"{name:22} {step_ms:18.1f} {max(r['state_mb'] for r in rows):20.2f} "
              f"{max(r['peak_rss_mb'] for r in rows):18.0f}  {bubble}")


if __name__ == "__main__":
    main()

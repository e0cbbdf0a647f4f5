"""Input pipeline throughput: samples/s the training package's loader delivers for each data format, with 0, 1, 2...
worker processes, side by side in one run (in brackets: samples/s per worker; for 0, the training thread's own).

Formats, generated into a temporary folder at realistic per-sample sizes:
  tokens      uint16 token shards, windows of --seq-len + 1 tokens (memory-mapped slices)
  npy images  uint8 .npy arrays at --image-size (memory-mapped, pre-decoded)
  jpeg tar    WebDataset tar shards of JPEGs (--source-size px, quality 90) decoded, crop-augmented and resized
              to --image-size (training.data.tar_shards), the format teams keep photos in
The last row, `planner`, is what the plan's input check reads for these sizes (contract.data_formats: measured
once, on a stated machine): a fresh run here shows how far this machine, or today, is from it.
Each cell times `training.data.loader.BatchSource` (the loop's own path: the sampler, the workers, the batch on the
CPU) over --steps micro-batches of --batch after --warmup, so the workers' start is left out. The figure to
compare with a step: samples/s per rank against the model's samples/s per GPU (a GPU step at 2,000 images/s
needs a loader above it, or the run is input bound: data_wait_ms in its metrics says by how much).

    python -m bench.data                        # CPU, a few seconds a cell
    python -m bench.data --workers 0 1 2 4 8 --steps 200 --source-size 500
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from contract.data_formats import GPU_HOST_VCPU_RATIO, IMAGES, TOKENS, WEBDATASET, load_rate
from prepare.images import write_shards
from training.data.datasets import ImageDataset, TokenDataset
from training.data.loader import BatchSource
from training.data.sampler import GlobalBatchSampler
from training.data.tar_shards import TarImageDataset


def make_tokens(root: Path, samples: int, seq_len: int) -> TokenDataset:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 50_000, samples * seq_len + 1, dtype=np.uint16).tofile(root / "shard-00000.bin")
    (root / "meta.json").write_text(json.dumps({"format": "tokens", "dtype": "uint16", "vocab_size": 50_000}))
    return TokenDataset(root, seq_len)


def make_npy(root: Path, samples: int, size: int) -> ImageDataset:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(root / "images-00000.npy", rng.integers(0, 256, (samples, size, size, 3), dtype=np.uint8))
    np.save(root / "labels-00000.npy", rng.integers(0, 10, samples))
    (root / "meta.json").write_text(json.dumps({"format": "images", "num_classes": 10, "image_size": size,
                                                "channels": 3}))
    return ImageDataset(root)


def make_jpeg_tar(root: Path, samples: int, size: int, source: int) -> TarImageDataset:
    """Smooth gradients with noise: JPEG compresses them like photos (random noise would be 3x larger)."""
    from PIL import Image

    files = root / "jpegs"
    files.mkdir(parents=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:source, 0:source]
    items = []
    for i in range(samples):
        phase = rng.uniform(0, 6.28, 3)
        pixels = np.stack([127 + 100 * np.sin(xx / (17 + 5 * c) + yy / 23 + phase[c]) for c in range(3)], -1)
        pixels += rng.normal(0, 8, pixels.shape)
        path = files / f"{i:05d}.jpg"
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        items.append((path, i % 10))
    write_shards(items, root / "shards", shard_samples=256)
    meta = {"format": "webdataset", "num_classes": 10, "image_size": size, "channels": 3}
    (root / "shards" / "meta.json").write_text(json.dumps(meta))
    return TarImageDataset(root / "shards", meta, seed=0)


def cpu_model() -> str:
    """The CPU's model name (Linux), the machine the figures are stated for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "CPU model unknown"
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines[:30])}
    return f"{field.get('model name', 'unknown')}, family {field.get('cpu family', '?')} model {field.get('model', '?')}"


def rate(dataset, workers: int, batch: int, steps: int, warmup: int) -> float:
    """Samples/s `BatchSource` delivers with this many workers (micro-batch `batch`, one rank)."""
    sampler = GlobalBatchSampler(len(dataset), batch, 0, 1, seed=0)
    source = BatchSource(dataset, sampler, batch, torch.device("cpu"), workers)
    try:
        for _ in range(warmup):
            source.next()
        began = time.perf_counter()
        for _ in range(steps):
            source.next()
        return steps * batch / (time.perf_counter() - began)
    finally:
        source.close()


class SlowDecode:
    """Sample i takes `seconds` to read, as a decode would (a sleep: the figure does not depend on free CPUs)."""

    data_format = "slow decode"

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def batch(self, indices: list[int], epoch: int = 0):
        time.sleep(self.seconds * len(indices))
        return torch.tensor(indices), torch.zeros(len(indices))


def wait_per_step(workers: int, decode_s: float, step_s: float, micro: int, steps: int = 30,
                  warmup: int = 10) -> float:
    """Seconds the step waits for its batch, on average after `warmup` steps, when each sample takes `decode_s` to
    read and the step's compute `step_s` (a sleep)."""
    source = BatchSource(SlowDecode(10_000, decode_s), GlobalBatchSampler(10_000, micro, 0, 1, seed=0), micro,
                         torch.device("cpu"), workers)
    waits = []
    try:
        for _ in range(warmup + steps):
            source.next()
            waits.append(source.data_wait_s)
            time.sleep(step_s)
    finally:
        source.close()
    return float(np.mean(waits[warmup:]))


def print_waits(workers_list: list[int], steps: int, warmup: int, decode_s: float = 0.015, step_s: float = 0.030,
                micro: int = 9) -> None:
    """The plan's input check model (jobs.planning.input_check: with workers a step waits only for what they cannot
    supply, decode per step / workers - step) beside the real loader's wait. Measured on a quiet 2-vCPU machine:
    37.4-37.7 ms for 2 workers (37.5 predicted), 3.8 ms for 4 (3.75); a loaded machine adds its scheduling."""
    print(f"\nwait per step, {micro} samples x {decode_s * 1000:g} ms decode, a {step_s * 1000:g} ms step: "
          "predicted (the plan's input check) | measured")
    for workers in (w for w in workers_list if w > 0):
        predicted = max(0.0, micro * decode_s / workers - step_s)
        measured = wait_per_step(workers, decode_s, step_s, micro, steps, warmup)
        print(f"  {workers} workers".ljust(12) + f"{predicted * 1000:8.2f} ms | {measured * 1000:8.2f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.data", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=32, help="samples per micro-batch")
    parser.add_argument("--steps", type=int, default=30, help="micro-batches timed per cell")
    parser.add_argument("--warmup", type=int, default=4, help="micro-batches before timing (workers starting)")
    parser.add_argument("--samples", type=int, default=512, help="samples per generated dataset")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--source-size", type=int, default=320, help="side of the generated JPEGs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the loader's own parallelism is the workers
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        formats = {  # heading -> (dataset, the format and work contract.data_formats keys its rates by)
            f"tokens ({args.seq_len})": (make_tokens(root / "tokens", args.samples, args.seq_len),
                                         TOKENS, args.seq_len),
            f"npy images ({args.image_size})": (make_npy(root / "npy", args.samples, args.image_size),
                                                IMAGES, args.image_size ** 2),
            f"jpeg tar ({args.source_size}->{args.image_size})": (
                make_jpeg_tar(root / "jpeg", args.samples, args.image_size, args.source_size),
                WEBDATASET, args.source_size ** 2),
        }
        print(f"samples/s delivered by training.data.loader.BatchSource, micro-batch {args.batch}, {args.steps} timed, "
              f"{len(os.sched_getaffinity(0))} CPUs ({cpu_model()}), load average {os.getloadavg()[0]:.2f}; "
              "in brackets: per worker")
        width = max(len(name) for name in formats) + 14
        print("workers".ljust(9) + "".join(name.rjust(width) for name in formats))
        for workers in args.workers:
            cells = []
            for dataset, _, _ in formats.values():
                r = rate(dataset, workers, args.batch, args.steps, args.warmup)
                cells.append(f"{r:,.0f} ({r / max(1, workers):,.0f})".rjust(width))
            print(str(workers).ljust(9) + "".join(cells), flush=True)
        # What the planner's input check reads for these sizes (before GPU_HOST_VCPU_RATIO), to compare with the
        # rows above: the training thread's rate | one worker's.
        print("planner".ljust(9) + "".join(
            f"{load_rate(fmt, work, False):,.0f} | {load_rate(fmt, work, True):,.0f}".rjust(width)
            for _, fmt, work in formats.values()))
        print("(planner: contract.data_formats' measured rates at these sizes, workers 0 | per worker; a GPU "
              f"instance's vCPU is taken at {GPU_HOST_VCPU_RATIO:g}x them)")
    print_waits(args.workers, args.steps, args.warmup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The package's loss in its forms, side by side: peak bytes over forward and backward beside the logits, and time.

    full              training.loss.full_cross_entropy (loss_chunk_tokens = 0): the whole fp32 copy and log-softmax
    chunked           training.loss.chunked_cross_entropy (the default, 1024 tokens a chunk, under checkpoint)
    compiled full     torch.compile of the full loss (what training.step runs with `compile`)
    compiled chunked  torch.compile of the chunked loss (not run by the package: it keeps more, see below)

    python -m bench.chunked_loss                                  # CPU: 8192 tokens x 50,368, bf16 and fp32
    python -m bench.chunked_loss --tokens 53248 --no-compile      # MPT-125M's 26 x 2048 (a GPU's memory)

Bytes: on CPU from torch.profiler's allocator events (`peak_bytes`, which tests/training/test_chunked_loss.py uses); on a GPU
torch.cuda.max_memory_allocated less what was allocated before. Measured on CPU (torch 2.13, 2 shared cores, 8192 x
50,368 bf16): full 4,951 MB (12 bytes a logit), chunked 1,651 MB (4), compiled full 825 MB (2: the gradient only,
fused), compiled chunked 2,476 MB (6); fp32 logits: full 12, chunked 8, compiled full 4, compiled chunked 8. Seconds
(one run each after a warm-up, bf16): full 3.3, chunked 4.1 (its forward runs twice), compiled full 1.0, compiled
chunked 2.5; the tests never assert on times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from contract.hyperparameters import LOSS_CHUNK_TOKENS
from training.loss import chunked_cross_entropy, full_cross_entropy


def peak_bytes(loss_fn, logits: torch.Tensor, y: torch.Tensor) -> int:
    """Peak bytes allocated over the loss's forward and backward beside what was allocated before (the logits). On
    CPU from the allocator's running total as torch.profiler records it (the first event's total less its own bytes
    is what was there before: tests/training/models/test_selective_checkpointing.py reads forward memory the same way)."""
    if logits.device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss_fn(logits, y).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_fn(logits, y).backward()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = [e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    before = events[0]["Total Allocated"] - events[0]["Bytes"]
    return max(e["Total Allocated"] for e in events) - before


def seconds(loss_fn, logits: torch.Tensor, y: torch.Tensor) -> float:
    sync = torch.cuda.synchronize if logits.device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    loss_fn(logits, y).backward()
    sync()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=50368)
    p.add_argument("--chunk", type=int, default=LOSS_CHUNK_TOKENS, help="tokens a chunk")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled forms (minutes on a CPU)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def chunked(logits, y):
        return chunked_cross_entropy(logits, y, args.chunk)

    forms = {"full": full_cross_entropy, "chunked": chunked}
    if not args.no_compile:
        forms |= {"compiled full": torch.compile(full_cross_entropy), "compiled chunked": torch.compile(chunked)}
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"# {name}, torch {torch.__version__}, {args.tokens} tokens x {args.vocab} vocabulary, "
          f"chunks of {args.chunk} tokens: peak beside the logits over forward and backward")
    print(f"{'dtype':6s} {'form':18s} {'peak MB':>10s} {'bytes/logit':>12s} {'seconds':>8s}")
    for dtype in args.dtypes.split(","):
        g = torch.Generator().manual_seed(0)
        logits = (3 * torch.randn(args.tokens, args.vocab, generator=g)).to(device, getattr(torch, {
            "bf16": "bfloat16", "fp32": "float32"}[dtype])).requires_grad_()
        y = torch.randint(0, args.vocab, (args.tokens,), generator=g).to(device)
        for form, fn in forms.items():
            seconds(fn, logits, y)  # warm-up (and compile)
            logits.grad = None
            took = seconds(fn, logits, y)
            logits.grad = None
            peak = peak_bytes(fn, logits, y)
            logits.grad = None
            print(f"{dtype:6s} {form:18s} {peak / 1e6:10,.1f} {peak / logits.numel():12.2f} {took:8.2f}", flush=True)


if __name__ == "__main__":
    main()

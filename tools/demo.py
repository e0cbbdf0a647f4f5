"""`make demo` (python -m tools.demo): the platform's main job on this machine, no AWS needed.

Prepares a real corpus (the byte tokens of Python's standard library), runs examples/local-fsdp.json with
`trainctl local` (FSDP, 2 processes, gloo), sends SIGTERM mid-run as a Spot reclaim would, runs it again on the
same work folder so it resumes from the checkpoint, prints the loss as it falls, and draws both runs'
loss, validation loss and throughput against steps (`trainctl local --chart`) to .demo/local-fsdp/chart.png.
Then the image path: JPEGs in an ImageFolder tree (generated: colour classes), converted to WebDataset tar shards
(`python -m training.prepare_images`), and a ViT trained on them by examples/local-vit-jpeg.json (2 processes,
a loader worker each decoding and augmenting ahead of the step; `data_wait_ms` on its metric lines).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from contract.metrics import DATA_WAIT_MS, STEP, TOKENS_PER_SEC, TRAIN_LOSS, VAL_LOSS, parse_metric_line

ROOT = Path(__file__).resolve().parents[1]
REQUEST = ROOT / "examples" / "local-fsdp.json"
DATA = ROOT / "data" / "stdlib-bytes"
WORKDIR = ROOT / ".demo" / "local-fsdp"
CHART = WORKDIR / "chart.png"
INTERRUPT_AT_STEP = 70
VIT_REQUEST = ROOT / "examples" / "local-vit-jpeg.json"
JPEGS = ROOT / "data" / "jpeg-colours"
VIT_WORKDIR = ROOT / ".demo" / "local-vit-jpeg"


def run(console: Console, label: str, interrupt_at: int | None, *extra: str, request: Path = REQUEST,
        workdir: Path = WORKDIR) -> tuple[int, list[dict[str, float]], float]:
    """Run `trainctl local` once, streaming its output; SIGTERM it after `interrupt_at` steps if given."""
    # --oversubscribe: the demo shows two ranks even on a one-CPU machine (the models are tiny).
    cmd = [sys.executable, "-m", "cli", "local", str(request), "--nproc", "2", "--oversubscribe", "--workdir",
           str(workdir), *extra]
    console.rule(f"[bold]{label}[/bold]: {' '.join(['trainctl', *cmd[3:]])}")
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    records: list[dict[str, float]] = []
    sent = False
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        # The launcher's own metric regexes: the demo reads the lines as SageMaker would.
        values = parse_metric_line(line)
        if values:
            records.append(values)
            if interrupt_at is not None and not sent and values.get(STEP, 0) >= interrupt_at:
                console.print(f"[yellow]demo: sending SIGTERM at step {int(values[STEP])}, as a Spot "
                              f"reclaim would[/yellow]")
                proc.send_signal(signal.SIGTERM)
                sent = True
    return proc.wait(), records, time.time() - started


def main() -> int:
    console = Console()
    if not (DATA / "train").is_dir():
        console.rule("[bold]prepare[/bold]: python -m training.prepare")
        subprocess.run([sys.executable, "-m", "training.prepare", "--out", str(DATA)], cwd=ROOT, check=True)
    shutil.rmtree(WORKDIR, ignore_errors=True)

    code1, first, t1 = run(console, "run 1", INTERRUPT_AT_STEP)
    checkpoints = sorted(p.name for p in (WORKDIR / "checkpoints").glob("step-*"))
    # The second run draws both runs on the work folder (its metrics file holds them all).
    code2, second, t2 = run(console, "run 2 (same work folder: resumes)", None, "--chart", str(CHART))
    if code1 != 0 or code2 != 0:
        console.print(f"[red]demo failed: exit codes {code1} and {code2}[/red]")
        return 1

    table = Table(title="FSDP, GPT tiny, 2 processes (gloo), byte tokens of Python's standard library",
                  title_justify="left")
    for column in ("run", STEP, TRAIN_LOSS, VAL_LOSS, "tokens/s"):
        table.add_column(column, justify="right")
    for label, records in (("1", first), ("2", second)):
        # The loss and throughput lines only: the straggler check's and the attempt's closing line carry times.
        for r in (r for r in records if SHOWN & r.keys()):
            table.add_row(label, f"{int(r[STEP])}", _fmt(r.get(TRAIN_LOSS)), _fmt(r.get(VAL_LOSS)),
                          _fmt(r.get(TOKENS_PER_SEC), "{:,.0f}"))
    console.print(table)
    losses = [r[TRAIN_LOSS] for r in first + second if TRAIN_LOSS in r]
    resumed_at = next((int(r[STEP]) for r in second if TRAIN_LOSS in r), None)
    console.print(f"checkpoints after the interruption: {', '.join(checkpoints) or 'none'}; "
                  f"run 2 logged first at step {resumed_at}")
    console.print(f"{TRAIN_LOSS} {losses[0]:.3f} -> {losses[-1]:.3f}; wall time {t1:.0f} s + {t2:.0f} s; "
                  f"model: {WORKDIR / 'model' / 'model.safetensors'}")
    console.print(f"chart of both runs (loss, validation loss, tokens/s by step): {CHART.relative_to(ROOT)}",
                  soft_wrap=True)  # one line, whatever the width: a path to click or copy
    return vit_on_jpegs(console)


def write_jpeg_folder(root: Path, per_class: int = 64, classes: int = 3, side: int = 48) -> None:
    """An ImageFolder tree of JPEGs whose class is the dominant colour channel (noise on top): learnable."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            pixels = rng.integers(0, 110, (side, side, 3), dtype=np.uint8)
            pixels[..., c] += 140
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{k:03d}.jpg", quality=90)


def vit_on_jpegs(console: Console) -> int:
    if not (JPEGS / "shards" / "train").is_dir():
        console.rule("[bold]prepare[/bold]: python -m training.prepare_images")
        write_jpeg_folder(JPEGS / "imagefolder")
        subprocess.run([sys.executable, "-m", "training.prepare_images", "--imagefolder", str(JPEGS / "imagefolder"),
                        "--out", str(JPEGS / "shards"), "--image-size", "32", "--val-fraction", "0.2",
                        "--shard-samples", "64"], cwd=ROOT, check=True)
    shutil.rmtree(VIT_WORKDIR, ignore_errors=True)
    code, records, seconds = run(console, "ViT on JPEG tar shards", None, request=VIT_REQUEST, workdir=VIT_WORKDIR)
    if code != 0:
        console.print(f"[red]demo failed: the ViT run exited {code}[/red]")
        return 1
    losses = [r[TRAIN_LOSS] for r in records if TRAIN_LOSS in r]
    waits = [r[DATA_WAIT_MS] for r in records if TRAIN_LOSS in r and DATA_WAIT_MS in r]
    console.print(f"ViT on JPEGs: {TRAIN_LOSS} {losses[0]:.3f} -> {losses[-1]:.3f}, {DATA_WAIT_MS} "
                  f"{min(waits):.1f}..{max(waits):.1f} a step, wall time {seconds:.0f} s")
    return 0


SHOWN = {TRAIN_LOSS, VAL_LOSS, TOKENS_PER_SEC}


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "" if value is None else pattern.format(value)


if __name__ == "__main__":
    sys.exit(main())

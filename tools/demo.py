"""`make demo` (python -m tools.demo): the platform's main job on this machine, no AWS needed.

Prepares a real corpus (the byte tokens of Python's standard library), runs examples/local-fsdp.json with
`trainctl local` (FSDP, 2 processes, gloo), sends SIGTERM mid-run as a Spot reclaim would, runs it again on the
same work folder so it resumes from the checkpoint, prints the loss as it falls, and draws both runs'
loss, validation loss and throughput against steps (`trainctl local --chart`) to .demo/local-fsdp/chart.png.
Then the image path: JPEGs in an ImageFolder tree (generated: colour classes), converted to WebDataset tar shards
(`python -m prepare.images`), and a ViT trained on them by examples/local-vit-jpeg.json (2 processes,
a loader worker each decoding and augmenting ahead of the step; `data_wait_ms` on its metric lines).

What it prints through its console (stages, the stop and the resume, the table, the summaries) is also its
transcript, written to .demo/transcript.txt: README's demo block is that file (`python -m tools.readme_demo`
pastes it; tests/cli/test_demo_transcript.py runs the demo and fails when README's block has another shape).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cli.commands.local import EXIT_STOPPED
from contract.metrics import DATA_WAIT_MS, STEP, TOKENS_PER_SEC, TRAIN_LOSS, VAL_LOSS, parse_metric_line

ROOT = Path(__file__).resolve().parents[1]
REQUEST = ROOT / "examples" / "local-fsdp.json"
VIT_REQUEST = ROOT / "examples" / "local-vit-jpeg.json"
INTERRUPT_AT_STEP = 70
# Under --out (default: the repository); shown relative to it, so a transcript reads the same wherever it ran.
DATA = Path("data") / "stdlib-bytes"
WORKDIR = Path(".demo") / "local-fsdp"
CHART = WORKDIR / "chart.png"
JPEGS = Path("data") / "jpeg-colours"
VIT_WORKDIR = Path(".demo") / "local-vit-jpeg"
TRANSCRIPT = Path(".demo") / "transcript.txt"
# The console's width, fixed: the transcript wraps the same on every terminal.
WIDTH = 110
# The streamed lines the transcript keeps: the stop, the resume and each run's end (the metric lines are the table).
EVENTS = ("[local] stopping", "[train] stopped at step", "stopped at step", "[checkpoint] resumed from",
          "done at step", "[train] completed at step", "chart:")


def run(console: Console, label: str, interrupt_at: int | None, *extra: str, request: Path = REQUEST,
        workdir: Path = WORKDIR, data: Path = DATA) -> tuple[int, list[dict[str, float]], float]:
    """Run `trainctl local` once, streaming its output; SIGTERM it after `interrupt_at` steps if given. Paths are
    relative to the working folder (--out)."""
    # --oversubscribe: the demo shows two ranks even on a one-CPU machine (the models are tiny). --data: the
    # folder under --out, wherever that is (the request's own dataset path is relative to the repository).
    cmd = [sys.executable, "-m", "cli", "local", str(request), "--nproc", "2", "--oversubscribe",
           "--workdir", str(workdir), "--data", str(data), *extra]
    console.rule(f"[bold]{label}[/bold]")
    console.print(f"$ trainctl local {request.relative_to(ROOT)} {' '.join(cmd[5:])}", soft_wrap=True, highlight=False)
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    records: list[dict[str, float]] = []
    sent = False
    assert proc.stdout is not None
    for line in proc.stdout:
        _echo(console, line)
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


def _echo(console: Console, line: str) -> None:
    """A streamed line to the terminal; through the console (so into the transcript) when it is an event."""
    if not any(event in line for event in EVENTS):
        sys.stdout.write(line)
        sys.stdout.flush()  # in order with the console's lines when the output is a pipe
        return
    console.print(line.rstrip("\n").replace(f"{Path.cwd()}/", ""), markup=False, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="folder for data/ and .demo/ (default: the repository)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # Every path below is relative to --out: the transcript names them the same wherever the demo ran.
    os.chdir(args.out)
    # This checkout's packages in the commands it starts, whatever folder they run in.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    console = Console(record=True, width=WIDTH)
    code = demo(console)
    TRANSCRIPT.parent.mkdir(parents=True, exist_ok=True)
    TRANSCRIPT.write_text(console.export_text())
    return code


def demo(console: Console) -> int:
    if not (DATA / "train").is_dir():
        # Not in the transcript (plain print): whether it runs depends on what an earlier demo left.
        print("prepare: python -m prepare.corpus", flush=True)
        subprocess.run([sys.executable, "-m", "prepare.corpus", "--out", str(DATA)], check=True)
    shutil.rmtree(WORKDIR, ignore_errors=True)

    code1, first, t1 = run(console, "run 1", INTERRUPT_AT_STEP)
    checkpoints = sorted(p.name for p in (WORKDIR / "checkpoints").glob("step-*"))
    # The second run draws both runs on the work folder (its metrics file holds them all).
    code2, second, t2 = run(console, "run 2 (same work folder: resumes)", None, "--chart", str(CHART))
    if code1 != EXIT_STOPPED or code2 != 0:  # run 1 is stopped (trainctl local says so in its status), run 2 completes
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
    console.print(f"chart of both runs (loss, validation loss, tokens/s by step): {CHART}",
                  soft_wrap=True)  # one line, whatever the width: a path to click or copy
    console.print(tensorboard_view(WORKDIR / "output" / "tensorboard"), soft_wrap=True)
    return vit_on_jpegs(console)


def tensorboard_view(folder: Path) -> str:
    """What TensorBoard shows of the runs (read back with its own reader), and the command that opens it."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    runs = EventMultiplexer().AddRunsFromDirectory(str(folder))
    runs.Reload()
    tags = sorted({tag for run in runs.Runs().values() for tag in run.get("scalars", [])})
    files = len(list(folder.glob("events.out.tfevents.*")))  # one a run
    return (f"tensorboard: {files} event files of {len(tags)} metrics ({', '.join(t for t in tags if t in SHOWN)}"
            f", ...): tensorboard --logdir {folder}")


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
        print("prepare: python -m prepare.images", flush=True)
        write_jpeg_folder(JPEGS / "imagefolder")
        subprocess.run([sys.executable, "-m", "prepare.images", "--imagefolder", str(JPEGS / "imagefolder"),
                        "--out", str(JPEGS / "shards"), "--image-size", "32", "--val-fraction", "0.2",
                        "--shard-samples", "64"], check=True)
    shutil.rmtree(VIT_WORKDIR, ignore_errors=True)
    code, records, seconds = run(console, "ViT on JPEG tar shards", None, request=VIT_REQUEST, workdir=VIT_WORKDIR,
                                 data=JPEGS / "shards")
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

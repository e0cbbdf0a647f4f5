"""`make tensorboard-screenshot` (python -m tools.tensorboard_screenshot): the demo's TensorBoard, as a browser shows it.

Starts TensorBoard on the event files `make demo` wrote (.demo/local-fsdp/output/tensorboard: the run stopped by
SIGTERM and its resume), opens its Scalars view in headless Chromium and saves the page as docs/tensorboard.png,
the view README shows. Chromium is Debian's (`apt-get install chromium`); nothing in the test suite needs it.

The Scalars view, not Time Series: Time Series draws its lines from a WebGL worker that a headless screenshot takes
before they are drawn (seen with Chromium 156: axes and tables, no lines); Scalars draws them in the page.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from contract.metrics import GRAD_NORM, LR, TOKENS_PER_SEC, TRAIN_LOSS
from tools.local_server import answers

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / ".demo" / "local-fsdp" / "output" / "tensorboard"
SHOT = ROOT / "docs" / "tensorboard.png"
# The metrics the view shows (a tag filter, TensorBoard's regex): loss as it falls, its gradient norm, the learning
# rate, throughput. (Not val_loss: the demo evaluates twice, and two points draw no line.)
TAGS = "|".join((TRAIN_LOSS, GRAD_NORM, TOKENS_PER_SEC, f"{LR}$"))
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def browser() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    sys.exit("no Chromium here: apt-get install chromium (Debian's package), then run this again")


def serve(events: Path, port: int) -> subprocess.Popen:
    """TensorBoard on loopback, once it answers (its start reads the event files first)."""
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(events), "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if answers(f"http://127.0.0.1:{port}/data/runs", server, timeout_s=60, poll_s=0.5):
        return server
    server.kill()
    sys.exit(f"TensorBoard did not answer on port {port} within 60 s (exit status {server.poll()})")


def screenshot(url: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # --virtual-time-budget: the page's own timers run until its data has been fetched and drawn.
    subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,900", "--virtual-time-budget=20000", f"--screenshot={out}", url],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=Path, default=EVENTS, help="the event files' folder (the demo's)")
    parser.add_argument("--out", type=Path, default=SHOT)
    args = parser.parse_args(argv)
    if not any(args.events.glob("events.out.tfevents.*")):
        sys.exit(f"no TensorBoard event files in {args.events}: run `make demo` first")
    port = free_port()
    server = serve(args.events, port)
    try:
        screenshot(f"http://127.0.0.1:{port}/#scalars&tagFilter={urllib.request.quote(TAGS)}", args.out)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    print(f"{args.out}: TensorBoard's Scalars view of {args.events}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

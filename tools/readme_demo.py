"""README's demo block is the demo's own transcript: `python -m tools.readme_demo` pastes .demo/transcript.txt
(written by `make demo`) between README's DEMO-TRANSCRIPT markers, as `python -m jobs.reference` does for the
request reference. `shape` is what tests/cli/test_demo_transcript.py compares: the lines, stages, names and
step numbers, without the losses, throughputs and times that differ from run to run."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tools.demo import ROOT, TRANSCRIPT

README = ROOT / "README.md"
START = "<!-- DEMO-TRANSCRIPT:START"
END = "<!-- DEMO-TRANSCRIPT:END -->"
FENCE = "```"
# A measured figure: a decimal (3.017, 1.7), a number with thousands commas (19,743), or seconds (19 s).
MEASURED = re.compile(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+|\d+(?= s\b)")
# The step a SIGTERM stops run 1 at depends on timing (the signal lands at step 70 or a step or two after): the step
# the demo signals at and the step the run stops at are both `<stop>`, so a transcript that stopped at 70 has the
# shape of one that stopped at 71.
STOPPED = re.compile(r"\[train\] stopped at step (\d+)")
SIGNALLED = re.compile(r"sending SIGTERM at step (\d+)")


def readme_block(readme: str) -> str:
    """The transcript README holds between the markers (without the marker line and the code fence)."""
    if START not in readme or END not in readme:
        raise ValueError(f"README has no {START} ... {END} block")
    block = readme[readme.index(START):readme.index(END)]
    block = block[block.index("\n") + 1:].strip()
    return block.removeprefix(FENCE + "text").removesuffix(FENCE).strip("\n")


def with_block(readme: str, transcript: str) -> str:
    """README with `transcript` between the markers, the rest as it was."""
    head, rest = readme[:readme.index(START)], readme[readme.index(START):]
    marker_line = rest[:rest.index("\n") + 1]
    tail = rest[rest.index(END):]
    body = "\n".join(line.rstrip() for line in transcript.strip("\n").splitlines())  # rich pads titles with spaces
    return f"{head}{marker_line}{FENCE}text\n{body}\n{FENCE}\n{tail}"


def shape(transcript: str) -> list[str]:
    """The transcript with every measured figure as `#` and run 1's signal and stop steps as `<stop>`, whitespace
    and rule lengths collapsed (the table's column widths follow its numbers); blank lines dropped."""
    steps = {m.group(1) for m in (STOPPED.search(transcript), SIGNALLED.search(transcript)) if m}
    lines = []
    for line in transcript.splitlines():
        for step in steps:
            line = re.sub(rf"\b{step}\b", "<stop>", line)
        line = MEASURED.sub("#", line)
        line = re.sub(r"([─━═])\1+", r"\1", line)
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", type=Path, default=ROOT / TRANSCRIPT, help="the demo's transcript")
    args = parser.parse_args(argv)
    if not args.transcript.is_file():
        print(f"{args.transcript}: no transcript; run `make demo` first (it writes one)", file=sys.stderr)
        return 2
    README.write_text(with_block(README.read_text(), args.transcript.read_text()))
    print(f"README.md: the demo block is now {args.transcript}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""README's demo block is what `make demo` prints: a fresh demo's transcript has the same shape (stages, lines,
names, step numbers; not the losses and times, which vary). When the demo changes what it prints, this fails
until `make demo && python -m tools.readme_demo` regenerates the block."""

from __future__ import annotations

import difflib
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tools.demo import TRANSCRIPT
from tools.readme_demo import END, START, readme_block, shape, with_block

SAMPLE = """\
───────── run 1: trainctl local examples/local-fsdp.json --nproc 2 ─────────
demo: sending SIGTERM at step 70, as a Spot reclaim would
[default0]:[train] stopped at step 71
│   1 │   70 │      3.019 │          │   21,700 │
checkpoints after the interruption: step-50, step-71; run 2 logged first at step 80
train_loss 5.331 -> 2.843; wall time 19 s + 38 s
"""


@pytest.mark.slow
def test_readme_carries_the_shape_of_a_fresh_demo(tmp_path):
    # The whole demo, as `make demo` runs it, in a folder of its own (its corpus is prepared in under a second).
    result = subprocess.run([sys.executable, "-m", "tools.demo", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    fresh = shape((tmp_path / TRANSCRIPT).read_text())
    documented = shape(readme_block((ROOT / "README.md").read_text()))
    diff = "\n".join(difflib.unified_diff(documented, fresh, "README.md", "a fresh demo", lineterm=""))
    assert documented == fresh, f"README's demo block is stale: run `make demo && python -m tools.readme_demo`\n{diff}"


def test_the_shape_keeps_steps_and_lines_and_drops_measured_figures():
    other_run = SAMPLE.replace("3.019", "2.987").replace("21,700", "9,113").replace("19 s", "27 s")
    assert shape(other_run) == shape(SAMPLE)
    # The stop step follows the signal's timing: wherever it lands, the shape is the same.
    assert shape(SAMPLE.replace("71", "73")) == shape(SAMPLE)
    # Stopped at the very step it was signalled at (a fresh demo did, where README's had stopped a step later).
    assert shape(SAMPLE.replace("71", "70")) == shape(SAMPLE)
    assert "checkpoints after the interruption: step-50, step-<stop>; run 2 logged first at step 80" in shape(SAMPLE)
    # What must be regenerated: a step number, a stage, a line, a name.
    for changed in (SAMPLE.replace("│   70 │", "│   60 │"), SAMPLE.replace("run 1:", "run one:"),
                    SAMPLE.replace("demo: sending SIGTERM at step 70, as a Spot reclaim would\n", ""),
                    SAMPLE.replace("train_loss 5", "loss 5"), SAMPLE.replace("step-50", "step-40")):
        assert shape(changed) != shape(SAMPLE), changed


def test_the_regenerator_replaces_the_block_and_nothing_else():
    readme = f"intro\n{START}: generated -->\n```text\nold line\n```\n{END}\nafter\n"
    new = with_block(readme, SAMPLE)
    assert new.startswith(f"intro\n{START}: generated -->\n```text\n") and new.endswith(f"```\n{END}\nafter\n")
    assert readme_block(new) == SAMPLE.strip("\n")
    assert with_block(new, SAMPLE) == new  # idempotent
    with pytest.raises(ValueError, match="DEMO-TRANSCRIPT"):
        readme_block("no markers here")

"""bench.data runs end to end on the CPU for every format and worker count (its figures are never asserted: they
belong in README, measured side by side in one run; this keeps its command working)."""

from __future__ import annotations

from bench import data
from contract.data_formats import TOKENS, load_rate


def test_the_bench_prints_every_format_side_by_side_per_worker_count(capsys):
    data.main(["--workers", "0", "1", "--batch", "4", "--steps", "2", "--warmup", "1", "--samples", "16",
               "--seq-len", "32", "--image-size", "16", "--source-size", "24"])
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("workers"))
    assert "tokens (32)" in header and "npy images (16)" in header and "jpeg tar (24->16)" in header
    rows = [line.split() for line in out if line[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1"] and all(len(row) == 1 + 2 * 3 for row in rows)
    assert all(float(cell.replace(",", "").strip("()")) > 0 for row in rows for cell in row[1:])
    # Beside them, the planner's figures for the same sizes (contract.data_formats), thread | worker per format.
    planner = next(line for line in out if line.startswith("planner")).split()[1:]
    assert len(planner) == 3 * 3 and planner[1::3] == ["|"] * 3
    assert float(planner[0].replace(",", "")) == round(load_rate(TOKENS, 32, worker=False))
    assert "CPUs (" in out[0] and "load average" in out[0]
    # Then the wait per step the plan's input check predicts beside the loader's, per worker count above 0.
    (wait,) = [line.split() for line in out if line.startswith("  1 workers")]
    assert wait[2:] == ["105.00", "ms", "|", wait[5], "ms"] and float(wait[5]) > 0

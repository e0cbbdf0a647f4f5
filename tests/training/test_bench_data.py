"""bench.data runs end to end on the CPU for every format and worker count (its figures are never asserted: they
belong in README, measured side by side in one run; this keeps its command working)."""

from __future__ import annotations

from bench import data


def test_the_bench_prints_every_format_side_by_side_per_worker_count(capsys):
    data.main(["--workers", "0", "1", "--batch", "4", "--steps", "2", "--warmup", "1", "--samples", "16",
               "--seq-len", "32", "--image-size", "16", "--source-size", "24"])
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("workers"))
    assert "tokens (32)" in header and "npy images (16)" in header and "jpeg tar (24->16)" in header
    rows = [line.split() for line in out if line[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1"] and all(len(row) == 1 + 2 * 3 for row in rows)
    assert all(float(cell.replace(",", "").strip("()")) > 0 for row in rows for cell in row[1:])

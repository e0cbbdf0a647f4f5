"""A stop saves only what can finish before SageMaker's SIGKILL; checkpoints also come by time, and the
metrics carry the age of the newest one."""

from __future__ import annotations

import json
import signal
import time

from tests.training.helpers import config
from training.checkpoint.markers import why_invalid
from training.loop import train
from training.parallel.process_group import setup
from training.resilience.stop import StopFlag


def test_a_stop_too_late_for_a_save_exits_at_once_and_the_previous_checkpoint_stands(tmp_path, corpus, capsys):
    cfg = config(tmp_path, corpus, max_steps=400, checkpoint_interval=2, log_interval=1)
    metrics = tmp_path / "output" / "metrics.jsonl"

    class LateStop(StopFlag):
        """SIGTERM as the loop reaches step 3 (read from the metrics it wrote), as if sent 115 s ago:
        120 s minus the 10 s kept for the exit leaves no time for a save."""

        @property
        def raised(self) -> bool:
            if self.signum is None and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                self.raise_(signal.SIGTERM, at=time.time() - 115)
            return self.signum is not None

    result = train(cfg, setup(cfg), LateStop())
    assert result.status == "stopped" and result.step == 3
    out = capsys.readouterr().out
    assert f"[checkpoint] stop at step {result.step}: a save takes about" in out and "stands" in out
    complete = sorted(int(p.name[5:]) for p in (tmp_path / "checkpoints").iterdir() if why_invalid(p) is None)
    assert complete and complete[-1] == result.step - result.step % 2  # the last cadence save, no stop save


def test_time_cadence_saves_and_metrics_carry_the_checkpoint_age(tmp_path, corpus, capsys):
    # 0.0005 minutes = 30 ms: every few steps of the tiny model, with no step interval at all.
    cfg = config(tmp_path, corpus, max_steps=30, checkpoint_interval=0, checkpoint_minutes=0.0005,
                 keep_checkpoints=100, log_interval=1)
    train(cfg, setup(cfg), StopFlag())
    saved = [int(p.name[5:]) for p in (tmp_path / "checkpoints").iterdir()]
    assert len([s for s in saved if s < cfg.max_steps]) >= 2  # by time, before the final save
    out = capsys.readouterr().out
    assert "stall" in out and "total" in out  # each save logs both
    records = [json.loads(x) for x in (tmp_path / "output" / "metrics.jsonl").read_text().splitlines()]
    ages = [r["checkpoint_age_s"] for r in records if "checkpoint_age_s" in r]
    assert len(ages) == cfg.max_steps and all(a >= 0 for a in ages)

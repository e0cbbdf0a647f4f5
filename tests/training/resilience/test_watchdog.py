"""Hangs caught in seconds here (minutes in a job), stragglers named: the watchdog and the straggler check, alone
and in real 2-rank runs on CPU with gloo, where one rank is made to block or to be slow (test-only injections,
training.resilience.heartbeat.ENV_TEST_HANG / ENV_TEST_SLOW)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from contract.failures import FailureCode, parse_failure_line
from contract.hyperparameters import TrainConfig
from contract.metrics import parse_metric_line
from tests.training.helpers import config, free_port, start_ranks
from training.resilience import watchdog
from training.resilience.heartbeat import ENV_TEST_HANG, ENV_TEST_SLOW, Heartbeat, during
from training.resilience.stragglers import StepTiming, Stragglers, ratios
from training.resilience.watchdog import Watchdog, process_group_timeout, stopped_ranks

# ---- alone --------------------------------------------------------------------------------------------------

def test_an_even_interval_names_nobody_and_a_slow_rank_is_named_after_the_patience():
    checks = Stragglers(margin=0.2, patience=3, hosts=["algo-1", "algo-2", "algo-3"])
    even = [[10, 1.0, 0.10, 0.01], [10, 1.0, 0.12, 0.01], [10, 1.0, 0.11, 0.01]]
    interval = checks.judge(even)
    assert interval.named == () and max(interval.ratios) < 1.05
    assert checks.metrics(interval) == {"straggler_rank": -1, "slowest_rank_ratio": max(interval.ratios)}
    # Rank 2 arrives last at the step boundary (waits 0 s where the others wait 0.4 s per step).
    slow = [[10, 10.0, 4.0, 0.1], [10, 10.0, 4.0, 0.1], [10, 10.0, 0.0, 0.1]]
    assert checks.judge(slow).named == () and checks.judge(slow).named == ()
    interval = checks.judge(slow)
    assert interval.named == (2,) and interval.ratios[2] == pytest.approx(1.4)
    assert checks.metrics(interval) == {"straggler_rank": 2, "slowest_rank_ratio": pytest.approx(1.4)}
    (line,) = checks.lines(interval)
    assert line.startswith("[stragglers] rank 2 on host algo-3 has been slow for 3 log intervals in a row")
    assert "nvidia-smi" in line
    assert checks.report() == [{"rank": 2, "host": "algo-3", "intervals": 1}]
    assert checks.judge(even).named == ()  # the streak ends with the slowness
    assert "rank 2 on host algo-3 named in 1 of 5" in checks.summary()


def test_a_rank_waiting_for_its_batch_is_slow_even_when_the_boundary_hides_it():
    # DDP's gradient all-reduce evens out the step boundary; the batch wait still tells the slow data pipeline.
    ratio, _, _ = ratios([[4, 4.0, 0.1, 0.05], [4, 4.0, 0.1, 2.0], [4, 4.0, 0.1, 0.05]])
    assert ratio[1] == pytest.approx(1.4875) and ratio[0] == ratio[2] == 1.0
    assert ratios([[0, 0.0, 0.0, 0.0], [3, 1.0, 0.1, 0.0]]) is None  # a save filled a rank's interval


def test_the_rank_not_waiting_in_a_collective_or_silent_is_the_one_that_stopped():
    waiting = {"waiting": True, "step": 7}
    assert stopped_ranks({0: waiting, 1: {"waiting": False, "step": 7}, 2: waiting}, 3)[0] == [1]
    assert stopped_ranks({0: waiting, 2: waiting}, 3) == ([1], stopped_ranks({0: waiting}, 2)[1])
    assert stopped_ranks({0: waiting, 1: {"waiting": True, "step": 6}}, 2)[0] == [1]
    suspects, how = stopped_ranks({0: waiting, 1: waiting}, 2)
    assert suspects == [] and "flight recorder" in how
    assert stopped_ranks({0: {"waiting": False, "step": 2}}, 1)[0] == [0]


def test_the_allowance_is_long_until_steps_are_timed_then_the_factor_or_the_floor(monkeypatch):
    now = [100.0]
    cfg = TrainConfig(hang_timeout_factor=5, hang_timeout_min_seconds=30, hang_timeout_startup_seconds=600)
    beats = Heartbeat(clock=lambda: now[0])
    dog = Watchdog(cfg, beats, rank=0, world=1, hosts=["algo-1"])
    assert dog.allowance()[0] == 600  # startup
    now[0] += 500
    assert beats.beat(1) is None  # the first step: compile, restore
    assert dog.allowance()[0] == 600 and beats.timed_steps == 0
    for step in (2, 3, 4):
        now[0] += 2.0
        assert beats.beat(step) == 2.0
    assert dog.allowance() == (30, "hang_timeout_min_seconds")
    for step in (5, 6):
        now[0] += 20.0
        beats.beat(step)
    assert dog.allowance()[0] == pytest.approx(5 * 46 / 5)  # 5 x the mean of 2, 2, 2, 20, 20
    with beats.phase("a checkpoint save"):
        now[0] += 400
        assert dog.overdue() is None and "a checkpoint save" in dog.allowance()[1]
    now[0] += 10
    assert beats.beat(7) is None
    assert beats.timed_steps == 5  # the step that held the save is not timed
    now[0] += 47
    assert dog.overdue() == pytest.approx(47)


def test_the_process_group_timeout_sits_above_the_watchdog_with_a_floor():
    assert process_group_timeout(TrainConfig()) == 900 + 120
    assert process_group_timeout(TrainConfig(hang_timeout_startup_seconds=60, hang_timeout_min_seconds=5)) == 600


def test_fire_dumps_the_stacks_and_writes_one_line(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "data"))
    exits = []
    beats = Heartbeat()
    dog = Watchdog(TrainConfig(hang_timeout_min_seconds=3), beats, rank=0, world=1, hosts=["algo-1"], exit=exits.append)
    beats.beat(1)
    line = dog.fire(42.0)
    assert exits == [1]
    code, message = parse_failure_line((tmp_path / "failure").read_text())
    assert code is FailureCode.HANG and (tmp_path / "failure").read_text().strip() == line
    assert message.startswith("rank 0 on host algo-1 stopped progressing after step 1")
    err = capfd.readouterr().err
    assert "[watchdog] rank 0 on host algo-1: no progress for 42 s after step 1" in err
    assert "most recent call first" in err  # faulthandler's dump of this process's threads


# ---- 2 ranks, gloo ------------------------------------------------------------------------------------------

def _worker(rank: int, world: int, port: int, values: dict, env: dict) -> None:
    from training.config import from_environment
    from training.loop import train
    from training.parallel.process_group import setup, teardown
    from training.resilience.stop import StopFlag

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), SM_CURRENT_HOST=f"host-{rank}", **env)
    torch.set_num_threads(1)
    if os.environ.get("TEST_STUCK_IN_DATA") == f"{rank}:4":  # this rank's 4th batch never comes
        from training.data import loader

        batches = loader.BatchSource.next

        def next_batch(self):
            next_batch.calls += 1
            if next_batch.calls == 4:
                time.sleep(3600)
            return batches(self)

        next_batch.calls = 0
        loader.BatchSource.next = next_batch
    try:
        cfg = from_environment(values, {})
        train(cfg, setup(cfg), StopFlag())
    finally:
        teardown()


def _run(values: dict, env: dict, limit_s: float) -> tuple[bool, float]:
    """Run 2 ranks; (whether every rank exited 0, seconds). Never waits past `limit_s`."""
    began = time.monotonic()
    context = start_ranks(_worker, (2, free_port(), values, env), 2, join=False)
    try:
        while not context.join(timeout=0.5):
            if time.monotonic() - began > limit_s:
                pytest.fail(f"the run did not end within {limit_s} s")
    except mp.ProcessExitedException:
        return False, time.monotonic() - began
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return True, time.monotonic() - began


def _values(root: Path, corpus: Path, **overrides) -> dict:
    return vars(config(root, corpus, strategy="ddp", micro_batch_size=2, **overrides))


def test_a_rank_that_blocks_is_named_within_the_watchdogs_time(tmp_path, corpus, capfd):
    values = _values(tmp_path, corpus, max_steps=8, hang_timeout_min_seconds=2.0, hang_timeout_factor=2.0,
                     hang_timeout_startup_seconds=60.0)
    ok, seconds = _run(values, {ENV_TEST_HANG: "1:3", "SM_OUTPUT_DATA_DIR": str(tmp_path / "output")}, 120)
    out = capfd.readouterr()
    assert not ok
    line = (tmp_path / "failure").read_text().strip()
    code, message = parse_failure_line(line)
    assert code is FailureCode.HANG, line
    assert message.startswith("rank 1 on host host-1 stopped progressing after step 3 (the other ranks wait for it "
                              "inside a collective; rank 1 at heartbeat.py:"), message
    assert "Retried on a health-checked instance" in message
    assert "[watchdog] rank 1 on host host-1: no progress for" in out.err
    assert "[watchdog] rank 0 on host host-0: no progress for" in out.err
    assert out.err.count("most recent call first") >= 2  # each rank's stacks
    # Rank 0 waits at the step boundary (the loop's agreement or the straggler exchange). Two processes write their
    # dumps to one stderr, which can cut a line of one with the other's under load: the frame names, not lines.
    assert any(frame in out.err for frame in ("agree", "_exchange", "all_reduce", "all_gather")), out.err[-3000:]
    assert seconds < 60, seconds  # startup (a few seconds), 3 steps, 2 s of allowance and the reports' exchange


def test_a_rank_stuck_mid_step_under_ddp_is_the_only_one_named(tmp_path, corpus):
    """Rank 1 never gets its 4th batch; rank 0 trains step 4 and waits in DDP's gradient all-reduce, inside
    backward (C++ hooks, no torch.distributed frame on its stack): it was read as stuck in its own work, and the
    line named both ranks, which would send the retry's health check to an innocent instance."""
    values = _values(tmp_path, corpus, max_steps=8, hang_timeout_min_seconds=2.0, hang_timeout_factor=2.0,
                     hang_timeout_startup_seconds=60.0)
    ok, _ = _run(values, {"TEST_STUCK_IN_DATA": "1:4", "SM_OUTPUT_DATA_DIR": str(tmp_path / "output")}, 120)
    assert not ok
    code, message = parse_failure_line((tmp_path / "failure").read_text())
    assert code is FailureCode.HANG
    assert message.startswith("rank 1 on host host-1 stopped progressing after step 3 (the other ranks wait for it "
                              "inside a collective"), message
    assert "rank 0 on host" not in message.split("):")[0]


@pytest.mark.parametrize(("slow", "named"), [("1:0.25", 1), ("*:0.1", -1)], ids=["rank-1-slowed", "even"])
def test_a_rank_slowed_on_purpose_is_named_and_an_even_run_names_nobody(tmp_path, corpus, capfd, slow, named):
    values = _values(tmp_path, corpus, max_steps=8)
    ok, _ = _run(values, {ENV_TEST_SLOW: slow}, 180)
    out = capfd.readouterr().out
    assert ok
    metrics = [parse_metric_line(line) for line in out.splitlines() if "straggler_rank=" in line]
    assert len(metrics) >= 5
    assert metrics[-1]["straggler_rank"] == named, out
    status = json.loads((tmp_path / "output" / "training_status.json").read_text())
    if named == 1:
        assert "[stragglers] rank 1 on host host-1 has been slow for 3 log intervals in a row" in out
        assert metrics[-1]["slowest_rank_ratio"] > 1.2
        assert status["stragglers"][0]["rank"] == 1 and status["stragglers"][0]["host"] == "host-1"
        assert "[stragglers] end of the run: rank 1 on host host-1 named in" in out
    else:
        assert "has been slow" not in out and status["stragglers"] == []
        assert "[stragglers] end of the run: no rank was persistently slow" in out


def test_no_module_holds_a_watchdog_and_its_reporters_work_alone():
    """The watchdog, the heartbeat and the straggler timing are instances handed to what reports to them: no module
    keeps one (a hidden singleton), and each works without the others (a checkpoint manager or an evaluator used
    alone has no heartbeat; one process never exchanges its times)."""
    for name in ("beat", "phase", "phased", "start", "stop", "active", "waited_at_boundary", "straggler_report"):
        assert not hasattr(watchdog, name), name
    with during(None, "nothing"):
        pass
    timing = StepTiming(TrainConfig(log_interval=1), rank=0, world=1, hosts=["algo-1"])
    timing.waited_at_boundary(1.0)
    timing.waited_for_data(0.5)
    timing.stepped(1, 2.0)
    assert timing.window.values() == [1.0, 2.0, 1.0, 0.5] and timing.report() == []


def test_a_single_process_has_a_watchdog_too(tmp_path):
    """One process (strategy single) had none: a hung loader worker was still hung 90 s after a 3 s allowance. The
    entry script, blocked after step 2 by the test injection, ends with the hang line naming it."""
    import subprocess
    import sys

    env = {**os.environ, ENV_TEST_HANG: "0:2", "SM_OUTPUT_DATA_DIR": str(tmp_path / "output"),
           "SM_CURRENT_HOST": "algo-1", "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(variable, None)
    cmd = [sys.executable, "-m", "training.train", "--strategy", "single", "--model", "gpt", "--model_size", "tiny",
           "--data", "synthetic", "--max_steps", "50", "--checkpoint_dir", str(tmp_path / "ck"),
           "--model_dir", str(tmp_path / "model"), "--output_data_dir", str(tmp_path / "output"),
           "--hang_timeout_min_seconds", "2", "--hang_timeout_factor", "2", "--hang_timeout_startup_seconds", "60"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 1, proc.stderr[-3000:]
    code, message = parse_failure_line((tmp_path / "failure").read_text())
    assert code is FailureCode.HANG and message.startswith("rank 0 on host algo-1 stopped progressing after step 2")

"""--chart: the series drawn are the metrics logged, per attempt (status) or per run (local); a real PNG."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import boto3
import pytest

from cli.aws import Aws
from cli.execution_history import describe
from cli.views.charts import (
    RunMetrics,
    execution_runs,
    read_metrics_file,
    render,
    series,
    split_runs,
    write_chart,
)
from contract.metrics import format_metrics
from tests.cli import machines
from tests.cli.conftest import DATA, REGION, channel_folder, run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(step: int, **values: float) -> dict:
    return {"step": step, **values}


def _jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# A work folder's metrics file: run 1 (steps 1-3, an evaluation at 2), run 2 resumed from step 2 (the step goes
# back), run 3 started by this command at t=200 right where run 2 stopped.
FILE = [
    _record(1, train_loss=5.0, tokens_per_sec=100.0, time=10.0),
    _record(2, train_loss=4.0, tokens_per_sec=120.0, time=11.0),
    _record(2, val_loss=4.5, time=11.5),
    _record(3, train_loss=3.5, tokens_per_sec=125.0, time=12.0),
    _record(3, train_loss=3.6, tokens_per_sec=90.0, time=100.0),
    _record(4, train_loss=3.1, tokens_per_sec=95.0, time=101.0),
    _record(5, train_loss=2.9, tokens_per_sec=130.0, time=200.0),
    _record(6, train_loss=2.7, tokens_per_sec=131.0, time=201.0),
]


def test_runs_are_split_where_a_run_began(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _jsonl(path, FILE)
    with path.open("a") as f:
        f.write('{"step": 7, "train_lo')  # a run killed while writing
    runs = split_runs(read_metrics_file(path), started=150.0)
    assert [run.label for run in runs] == ["run 1", "run 2", "run 3"]
    assert series(runs[0], "train_loss") == ([1, 2, 3], [5.0, 4.0, 3.5])
    assert series(runs[0], "val_loss") == ([2], [4.5])
    assert series(runs[1], "train_loss") == ([3, 4], [3.6, 3.1])
    assert series(runs[2], "tokens_per_sec") == ([5, 6], [130.0, 131.0])
    assert [len(run.records) for run in split_runs(read_metrics_file(path))] == [4, 4]  # without `started`


def test_runs_that_each_resumed_where_the_one_before_stopped_stay_apart(tmp_path):
    # Three runs on one work folder, each resumed at the very step the one before stopped (steps 1-2, 3-4, 5-6),
    # all before this command: the steps never go back. Was: merged into fewer runs (the file did not mark where a
    # run began); each training process now stamps its records with when it started.
    from contract.metrics import RUN_STARTED

    path = tmp_path / "metrics.jsonl"
    _jsonl(path, [_record(s, train_loss=5.0 - s / 10, time=10.0 * s, **{RUN_STARTED: 100.0 * ((s + 1) // 2)})
                  for s in range(1, 7)])
    runs = split_runs(read_metrics_file(path))
    assert [series(run, "train_loss")[0] for run in runs] == [[1, 2], [3, 4], [5, 6]]


def test_the_logger_stamps_each_record_with_when_its_run_started(tmp_path):
    from contract.metrics import RUN_STARTED
    from training.metrics.logger import MetricsLogger

    first, second = MetricsLogger(tmp_path, enabled=True, total_steps=4), MetricsLogger(tmp_path, enabled=True,
                                                                                         total_steps=4)
    second.run_started += 1  # a later process
    for logger, step in ((first, 1), (first, 2), (second, 3)):
        logger.log({"step": step, "train_loss": 1.0})
    records = read_metrics_file(tmp_path / "metrics.jsonl")
    assert [r[RUN_STARTED] for r in records] == [first.run_started] * 2 + [second.run_started]
    assert [len(run.records) for run in split_runs(records)] == [2, 1]


def test_the_figure_plots_exactly_the_series(tmp_path):
    runs = split_runs([{k: float(v) for k, v in r.items()} for r in FILE], started=150.0)
    runs[1].records.append({"step": 5.0, "train_loss": float("nan")})  # a diverged loss is left out
    figure = render(runs, "three runs")
    loss, speed = figure.axes
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in loss.get_lines()}
    assert drawn["run 1 train"] == ([1, 2, 3], [5.0, 4.0, 3.5])
    assert drawn["run 1 validation"] == ([2], [4.5])
    assert drawn["run 2 train"] == ([3, 4], [3.6, 3.1])
    assert "run 2 validation" not in drawn
    throughput = {line.get_label(): list(line.get_ydata()) for line in speed.get_lines()
                  if not line.get_label().startswith("_")}
    assert throughput == {"run 1": [100.0, 120.0, 125.0], "run 2": [90.0, 95.0], "run 3": [130.0, 131.0]}
    assert speed.get_ylabel() == "tokens/s" and speed.get_xlabel() == "step"
    path = tmp_path / "sub" / "chart.png"
    assert write_chart(runs, path, "three runs")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_samples_per_second_when_no_tokens(tmp_path):
    runs = [RunMetrics("vit", [{"step": 1.0, "train_loss": 2.0, "samples_per_sec": 50.0}])]
    assert render(runs, "vit").axes[1].get_ylabel() == "samples/s"
    assert not write_chart([RunMetrics("empty")], tmp_path / "none.png", "empty")
    assert not (tmp_path / "none.png").exists()


# ---- trainctl status --chart ---------------------------------------------------------------------------


def _log_lines(job: str, *lines: str) -> None:
    logs = boto3.client("logs", region_name=REGION)
    start_ms = int(time.time() * 1000) - 60_000
    logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=f"{job}/algo-1-1")
    logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=f"{job}/algo-1-1",
                        logEvents=[{"timestamp": start_ms + i, "message": m} for i, m in enumerate(lines)])


@pytest.fixture
def two_attempts(deployed, platform_doc):
    from jobs.naming import new_run_id
    from jobs.platform import PlatformSettings
    from jobs.render.training_job import render_create_training_job
    from jobs.request.parse import parse_request

    request = parse_request(json.loads((DATA / "ddp.json").read_text()))
    create = render_create_training_job(request, PlatformSettings.from_dict(platform_doc),
                                        run_id=new_run_id(request.name), attempt=1)
    machine = deployed(machines.training_machine(create, machines.SUCCEED, attempts=2))
    sfn = boto3.client("stepfunctions", region_name=REGION)
    arn = sfn.start_execution(stateMachineArn=machine, name="ch", input="{}")["executionArn"]
    deadline = time.monotonic() + 20
    while sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    boto3.client("logs", region_name=REGION).create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    _log_lines("ch-a1", "starting", format_metrics({"step": 10, "train_loss": 3.0, "tokens_per_sec": 900.0}),
               format_metrics({"step": 20, "train_loss": 2.5, "tokens_per_sec": 950.0}),
               format_metrics({"step": 20, "val_loss": 2.7}), "interrupted: SIGTERM")
    _log_lines("ch-a2", "[checkpoint] resumed at step 20",
               format_metrics({"step": 30, "train_loss": 2.2, "tokens_per_sec": 990.0}))
    return arn


def test_status_chart_draws_each_attempts_logged_metrics(two_attempts, tmp_path):
    runs = execution_runs(Aws(), describe(Aws(), two_attempts))
    assert [run.label for run in runs] == ["attempt 1 (ml.g5.12xlarge)", "attempt 2 (ml.g5.12xlarge)"]
    assert series(runs[0], "train_loss") == ([10.0, 20.0], [3.0, 2.5])
    assert series(runs[0], "val_loss") == ([20.0], [2.7])
    assert series(runs[1], "tokens_per_sec") == ([30.0], [990.0])

    path = tmp_path / "ch.png"
    result = run("status", "ch", "--chart", path)
    assert result.exit_code == 0, result.output
    assert f"chart: {path}" in result.stdout
    assert path.read_bytes()[:8] == PNG_MAGIC
    as_json = run("status", "ch", "--json", "--chart", tmp_path / "j.png")
    assert json.loads(as_json.stdout)["name"] == "ch" and "chart:" in as_json.stderr


def test_status_chart_before_any_metrics(deployed, create_quiet, tmp_path):
    result = run("status", create_quiet, "--chart", tmp_path / "q.png")
    assert result.exit_code == 0, result.output
    assert "no chart: no attempt of quiet has logged metrics yet" in result.stdout
    assert not (tmp_path / "q.png").exists()


@pytest.fixture
def create_quiet(deployed):
    machine = deployed({"StartAt": "End", "States": {"End": machines.SUCCEED}})
    boto3.client("stepfunctions", region_name=REGION).start_execution(stateMachineArn=machine, name="quiet")
    return "quiet"


@pytest.mark.parametrize("value", ["chart.jpgx", "chart"])
def test_a_chart_name_matplotlib_cannot_write_is_refused(value, tmp_path):
    result = run("status", "x", "--chart", tmp_path / value)
    assert result.exit_code == 2 and "the file name must end in .png, .svg, .pdf" in result.stderr


def test_without_matplotlib_chart_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets when it is absent
    for args in (("status", "x"), ("local", DATA / "local-tiny.json")):
        result = run(*args, "--chart", tmp_path / "c.png")
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert "--chart needs matplotlib, which is not installed" in result.stderr
        assert "pip install 'sagemaker-training-platform[chart]'" in result.stderr


# ---- trainctl local --chart ----------------------------------------------------------------------------


def test_local_chart_draws_the_work_folders_runs(tmp_path, monkeypatch):
    """The engine is stood in for by one that appends this run's records, as the training loop does."""
    import cli.container_emulator

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        channel_folder(tmp_path / "corpus" / split)
    workdir = tmp_path / "w"
    _jsonl(workdir / "output" / "data" / "metrics.jsonl", [_record(1, train_loss=3.0, time=1.0)])

    def run_local(create: dict, *, workdir: Path, **_: object) -> int:
        with (workdir / "output" / "data" / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(_record(2, train_loss=2.0, time=time.time())) + "\n")
        return 0

    monkeypatch.setattr(cli.container_emulator, "run_local", run_local)
    result = run("local", DATA / "local-tiny.json", "--workdir", workdir, "--chart", tmp_path / "c.png")
    assert result.exit_code == 0, result.output
    assert f"chart: {tmp_path / 'c.png'}" in result.stdout
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    runs = split_runs(read_metrics_file(workdir / "output" / "data" / "metrics.jsonl"), started=100.0)
    assert [series(r, "train_loss") for r in runs] == [([1.0], [3.0]), ([2.0], [2.0])]


@pytest.mark.slow
def test_local_chart_of_a_real_run(tmp_path, monkeypatch):
    """The real engine, one process: the chart is drawn from the metrics file the training loop wrote."""
    from prepare.corpus import prepare

    monkeypatch.chdir(tmp_path)
    prepare(tmp_path / "corpus", val_fraction=0.25, max_bytes=300_000, shard_bytes=200_000)
    result = run("local", DATA / "local-tiny.json", "--nproc", "1", "--chart", "out/chart.png")
    assert result.exit_code == 0, result.output
    assert "chart: out/chart.png" in result.stdout
    assert (tmp_path / "out" / "chart.png").read_bytes()[:8] == PNG_MAGIC
    (only,) = split_runs(read_metrics_file(tmp_path / ".trainctl/local/cli-local-tiny/output/data/metrics.jsonl"))
    assert series(only, "train_loss")[0] == [1, 2, 3, 4, 5, 6] and series(only, "val_loss")[0]

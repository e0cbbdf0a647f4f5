"""The checkpoint-age alarm end to end: the job prints `checkpoint_overdue` (its checkpoint age in cadences) and
sends it to its platform's own namespace, the synthesized dashboard plots it and the alarm fires when the most
overdue run stays above twice its cadence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn

from contract.metrics import METRIC_NAMES, METRIC_NAMESPACE, format_metrics, parse_metric_line
from jobs.naming import metrics_namespace
from platform_constructs.monitoring import LauncherMonitoringProps
from tests.launcher.conftest import launcher_stack_template
from tests.training.helpers import SEQ, config, write_tokens
from training.loop import train
from training.metrics.meter import checkpoint_overdue
from training.parallel.process_group import setup
from training.resilience.stop import StopFlag

ALARM = "mltrain-training-checkpoint-overdue"
OWN_NAMESPACE = metrics_namespace("mltrain")


def _alarms(templates: dict[str, dict]) -> dict[str, dict]:
    launcher = launcher_stack_template(templates)
    return {r["Properties"]["AlarmName"]: r["Properties"]
            for r in launcher["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"}


def test_the_alarm_takes_the_most_overdue_run_above_twice_its_cadence(templates):
    alarms = _alarms(templates)
    alarm = alarms[ALARM]
    (query,) = alarm["Metrics"]
    # The platform's own namespace (what its jobs send, training.metrics.cloudwatch), never SageMaker's shared one.
    assert query["Expression"] == f'SELECT MAX(checkpoint_overdue) FROM SCHEMA("{OWN_NAMESPACE}", RunId)'
    assert query["ReturnData"] is True and query["Period"] == 300
    assert alarm["Threshold"] == 2 and alarm["ComparisonOperator"] == "GreaterThanThreshold"
    # "Stays above": every datapoint of 10 minutes, not one stale sample.
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 2
    assert alarm["TreatMissingData"] == "notBreaching"
    # Same notifications as the launcher's other alarms.
    gpu = alarms["mltrain-training-low-gpu-utilization"]
    assert alarm["AlarmActions"] == gpu["AlarmActions"] and alarm["OKActions"] == gpu["OKActions"]


def dashboards(templates) -> dict[str, str]:
    """Each dashboard of the launcher stack by name, its body as the template writes it."""
    launcher = launcher_stack_template(templates)
    return {r["Properties"]["DashboardName"]: json.dumps(r["Properties"]["DashboardBody"])
            for r in launcher["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"}


def search(namespace: str, dimensions: str, metric: str) -> str:
    return f"SEARCH('{{{namespace},{dimensions}}} MetricName=\\\\\\\"{metric}\\\\\\\"', 'Maximum', 300)"


def test_the_dashboard_plots_the_age_and_the_alarm(templates):
    launcher = launcher_stack_template(templates)
    body = dashboards(templates)["mltrain-training"]
    for metric in ("checkpoint_age_s", "checkpoint_overdue"):
        assert search(OWN_NAMESPACE, "RunId", metric) in body, metric
    assert "alarm above 2" in body and '\\"value\\":2,\\"label\\":\\"alarm threshold\\"' in body
    assert body.count(ALARM) == 0  # the alarm status widget refers to it by ARN (a Fn::GetAtt), not by name
    alarm_id = next(k for k, r in launcher["Resources"].items()
                    if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"]["AlarmName"] == ALARM)
    assert alarm_id in body


def test_the_dashboard_plots_the_wait_for_data_and_the_input_bound_share(templates):
    body = dashboards(templates)["mltrain-training"]
    for metric in ("data_wait_ms", "data_wait_share"):
        assert search(OWN_NAMESPACE, "RunId", metric) in body, metric
    assert "input bound above 0.1, the default input_bound_share" in body
    assert '\\"value\\":0.1,\\"label\\":\\"input bound\\"' in body


def test_the_platform_teams_dashboard_sees_every_job_and_the_teams_see_their_own(templates):
    # SageMaker's namespace holds every team's jobs (and any team's role may write it): only the platform team's
    # all-jobs dashboard reads it; the launcher's own dashboard reads only its own namespace.
    found = dashboards(templates)
    assert set(found) == {"mltrain-training", "mltrain-training-all-jobs"}
    assert METRIC_NAMESPACE not in found["mltrain-training"]
    assert OWN_NAMESPACE not in found["mltrain-training-all-jobs"]
    for metric in ("checkpoint_overdue", "data_wait_ms"):
        assert search(METRIC_NAMESPACE, "TrainingJobName", metric) in found["mltrain-training-all-jobs"], metric


def test_monitoring_checks_the_overdue_props():
    stack = Stack(App(), "M")
    machine = sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P")))
    topic = sns.Topic(stack, "T")
    for props, name in (({"checkpoint_overdue_factor": 1}, "checkpoint_overdue_factor"),
                        ({"checkpoint_overdue_minutes": 7}, "checkpoint_overdue_minutes")):
        with pytest.raises(ValueError, match=name):
            LauncherMonitoringProps(name_prefix="mltrain", state_machine=machine, topic=topic, **props)


@pytest.mark.parametrize(("every_s", "interval", "step_s", "expected"), [
    (60.0, 0, None, 90 / 60),          # checkpoint_minutes=1: its seconds
    (0.0, 100, 0.3, 90 / 30),          # checkpoint_interval=100 steps of 0.3 s
    (600.0, 100, 0.3, 90 / 30),        # both: a save comes at whichever is first
    (20.0, 100, 0.3, 90 / 20),
    (0.0, 100, None, 0.0),             # no step timed yet: no step cadence in seconds
    (0.0, 0, 0.3, 0.0),                # no cadence at all: never overdue
])
def test_overdue_is_the_age_in_cadences(every_s, interval, step_s, expected):
    assert checkpoint_overdue(90.0, every_s, interval, step_s) == pytest.approx(expected)


def test_the_line_carries_it_for_the_metric_definitions():
    assert "checkpoint_overdue" in METRIC_NAMES
    assert parse_metric_line(format_metrics({"step": 3, "checkpoint_overdue": 2.34567})) == {
        "step": 3, "checkpoint_overdue": 2.3457}


def test_a_run_prints_its_checkpoint_age_in_cadences(tmp_path):
    """Before the first save the age grows step by step; after a save it counts from that save.

    Every assertion compares readings of one clock (the age and the line's `time` are both wall-clock seconds)
    or holds for any step times: a loaded machine cannot break it. `time` is rounded to the millisecond, hence
    the 1 ms beside the two lines' difference."""
    rng = np.random.default_rng(0)
    write_tokens(tmp_path / "corpus" / "train", [rng.integers(0, 64, SEQ * 16 + 1)])
    cfg = config(tmp_path, tmp_path / "corpus", validation_dir="", max_steps=9, checkpoint_interval=4)
    train(cfg, setup(cfg), StopFlag())
    records = {r["step"]: r for r in map(json.loads, (tmp_path / "output" / "metrics.jsonl").read_text().splitlines())}
    overdue = {step: r["checkpoint_overdue"] for step, r in records.items()}
    age = {step: r["checkpoint_age_s"] for step, r in records.items()}
    assert sorted(overdue) == list(range(1, 10))
    # Before the first save the age spans every timed step (and the start-up before them): at least k/4 of the
    # 4-step cadence by step k. Step 4's metrics are logged before its save.
    assert all(overdue[k] >= k / 4 for k in range(1, 5))
    # Between saves the age only grows (one origin, later readings).
    assert age[1] < age[2] < age[3] < age[4] and age[5] < age[6] < age[7] < age[8] and age[9] > 0
    # After the saves of steps 4 and 8 it counts from the save, which came after that step's line: younger than
    # the time between the two lines (counted from the start, step 5's age would exceed step 4's).
    for saved in (4, 8):
        assert age[saved + 1] < records[saved + 1]["time"] - records[saved]["time"] + 0.001, saved
    # The cadence in seconds is 4 x the run's mean step time (every step is logged: the mean of their times).
    for step in (3, 5, 9):
        mean_step_s = sum(records[s]["step_time_ms"] for s in range(1, step + 1)) / step / 1000
        assert records[step]["checkpoint_age_s"] / overdue[step] == pytest.approx(4 * mean_step_s, rel=1e-6)

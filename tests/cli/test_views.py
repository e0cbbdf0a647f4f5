"""How trainctl reads an execution's history and shows progress on a terminal."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import boto3
from rich.console import Console

from cli.aws import Aws
from cli.execution_history import view_from
from cli.views.progress import follow
from tests.cli import machines
from tests.cli.conftest import REGION

ARN = "arn:aws:states:us-east-1:123456789012:execution:mltrain-launcher:run"


def _scheduled(job: str, instance_type: str, spot: bool) -> dict:
    params = {"TrainingJobName": job, "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": 2},
              "EnableManagedSpotTraining": spot}
    return {"type": "TaskScheduled", "taskScheduledEventDetails": {
        "resourceType": "sagemaker", "resource": "createTrainingJob.sync", "region": REGION,
        "parameters": json.dumps(params)}}


def _entered(state: str) -> dict:
    return {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": state, "input": "{}"}}


def _lambda_result(result: dict) -> dict:
    # The launcher's LambdaInvoke tasks use payload_response_only: the function ARN is the resource and the
    # history carries LambdaFunctionSucceeded with the handler's return value.
    return {"type": "LambdaFunctionSucceeded", "lambdaFunctionSucceededEventDetails": {"output": json.dumps(result)}}


def test_attempts_and_decisions_from_the_launchers_history():
    decision = {"action": "retry", "wait_seconds": 300, "category": "capacity",
                "reason": "CapacityError: Unable to provision requested ML compute capacity"}
    events = [
        _entered("Prepare"),
        _lambda_result({"run": {}, "launch": {"create": {}}}),  # prepare: no decision
        _entered("Launch"),
        _scheduled("mltrain-run-1234abcd-a1", "ml.p4d.24xlarge", True),
        {"type": "TaskFailed", "taskFailedEventDetails": {"resourceType": "sagemaker", "resource":
                                                          "createTrainingJob.sync", "error": "States.TaskFailed"}},
        _entered("Decide"),
        _lambda_result({"run": {}, "launch": {"create": {}}, "decision": decision}),
        _entered("Backoff"),
        _entered("Launch"),
        _scheduled("mltrain-run-1234abcd-a2", "ml.p5.48xlarge", False),
    ]
    description = {"executionArn": ARN, "name": "run", "status": "RUNNING", "startDate": datetime.now(UTC),
                   "input": json.dumps({"name": "gpt"})}
    view = view_from(description, events)
    assert view.current_state == "Launch" and view.request_name == "gpt"
    first, second = view.attempts
    assert (first.number, first.job_name, first.instance_type, first.spot) == (1, "mltrain-run-1234abcd-a1",
                                                                               "ml.p4d.24xlarge", True)
    assert (first.error, first.category, first.action) == ("States.TaskFailed", "capacity", "retry")
    assert first.reason.startswith("CapacityError")
    assert (second.number, second.instance_type, second.spot, second.category) == (2, "ml.p5.48xlarge", False,
                                                                                   None)


def test_a_finished_runs_summary_fills_the_attempts():
    summary = {"status": "Succeeded", "attempts": [
        {"job_name": "j-a1", "category": "spot_interruption", "reason": "Spot capacity reclaimed"},
        {"job_name": "j-a2", "category": "", "reason": ""}], "final_metrics": {"train_loss": 1.5}}
    description = {"executionArn": ARN, "name": "run", "status": "SUCCEEDED", "output": json.dumps(summary)}
    view = view_from(description, [_scheduled("j-a1", "ml.g5.48xlarge", True),
                                   _scheduled("j-a2", "ml.g5.48xlarge", True)])
    assert view.attempts[0].category == "spot_interruption" and view.attempts[0].reason == "Spot capacity reclaimed"
    assert view.attempts[1].category is None


def test_progress_on_a_terminal_is_a_live_table(deployed, platform_doc):
    from jobs.platform import PlatformSettings
    from jobs.render.training_job import render_create_training_job
    from jobs.request.parse import parse_request
    from tests.cli.conftest import DATA

    request = parse_request(json.loads((DATA / "ddp.json").read_text()))
    create = render_create_training_job(request, PlatformSettings.from_dict(platform_doc), run_id="t-0000abcd",
                                        attempt=1)
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    arn = boto3.client("stepfunctions", region_name=REGION).start_execution(
        stateMachineArn=machine, name="live", input="{}")["executionArn"]
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    view = follow(Aws(region=REGION), arn, console=console, interval=0.05)
    assert view.status == "SUCCEEDED"
    text = screen.getvalue()
    assert "live-a1 (ml.g5.12xlarge)" in text and "Completed / Completed" in text
    assert "\x1b[" in text  # cursor movement: the table was redrawn in place, not printed line by line


def test_an_attempt_that_ends_between_two_polls_is_still_shown_once(monkeypatch):
    """A capacity error answered in seconds: the first poll sees no job, the next already sees the second
    attempt. The watch prints the first attempt as it ended, once, before the second."""
    from cli.execution_history import AttemptView, ExecutionView
    from cli.views import progress

    first = AttemptView(number=1, job_name="run-a1", instance_type="ml.p4d.24xlarge", spot=False,
                        error="States.TaskFailed", category="capacity", action="retry")
    second = AttemptView(number=2, job_name="run-a2", instance_type="ml.p5.48xlarge", spot=False)
    views = iter([
        ExecutionView(arn=ARN, name="run", status="RUNNING", start=None, stop=None, current_state="Prepare"),
        ExecutionView(arn=ARN, name="run", status="RUNNING", start=None, stop=None, current_state="Launch",
                      attempts=[first, second]),
        ExecutionView(arn=ARN, name="run", status="RUNNING", start=None, stop=None, current_state="Launch",
                      attempts=[first, second]),
        ExecutionView(arn=ARN, name="run", status="SUCCEEDED", start=None, stop=None, current_state=None,
                      attempts=[first, second]),
    ])
    jobs = {"run-a1": {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed"},
            "run-a2": {"TrainingJobStatus": "Completed", "SecondaryStatus": "Completed"}}
    monkeypatch.setattr(progress, "describe", lambda aws, arn: next(views))
    monkeypatch.setattr(progress, "describe_job", lambda aws, name: jobs[name])
    screen = io.StringIO()
    follow(Aws(region=REGION), ARN, console=Console(file=screen, width=250), interval=0, sleep=lambda s: None)
    lines = screen.getvalue().splitlines()
    ones = [line for line in lines if "attempt=1 " in line]
    assert len(ones) == 1 and "instance=ml.p4d.24xlarge" in ones[0] and "job_status=Failed/Failed" in ones[0]
    twos = [i for i, line in enumerate(lines) if "attempt=2 " in line]
    assert twos and lines.index(ones[0]) < twos[0]

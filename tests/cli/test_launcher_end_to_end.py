"""trainctl against the launcher's real state machine: the synthesized definition, executed by moto.

The launcher room's harness (tests/launcher) runs the definition with a scripted SageMaker `.sync`
integration and the `jobs` handlers in-process. Here trainctl drives it like an engineer would: submit
with --wait, then status and logs, reading the real execution history the launcher produces.
Needs the CDK synth (the session's `templates` fixture, shared between workers); the harness is
module-scoped, so its moto mock and patches end with this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.cli.conftest import REGION, run
from tests.launcher import sagemaker_sync as sm
from tests.launcher.definition import launcher_definition
from tests.launcher.harness import LauncherHarness

pytestmark = pytest.mark.slow

SETTINGS_FILE = Path(__file__).parents[1] / "launcher" / "platform_settings.json"
# Retry waits at 0: moto's Wait states take real time.
FAST_RETRY = {"capacity_wait_seconds": 0, "capacity_wait_max_seconds": 0, "interruption_wait_seconds": 0,
              "internal_error_wait_seconds": 0, "api_error_wait_seconds": 0, "api_error_wait_max_seconds": 0}


def job_request(**overrides) -> dict:
    return {
        "name": "gpt-125m-fsdp",
        "strategy": "fsdp",
        "model": "gpt",
        "model_size": "125m",
        "dataset": "s3://mltrain-datasets-123456789012-us-east-1/datasets/tokens/",
        "instance": {"type": "ml.p4d.24xlarge", "count": 2, "fallbacks": ["ml.p5.48xlarge"]},
        "max_runtime_hours": 12,
        "retry": FAST_RETRY,
    } | overrides


@pytest.fixture(scope="module")
def launcher(templates: dict[str, dict]) -> Iterator[LauncherHarness]:
    (template,) = [t for t in templates.values()
                   if any(r["Type"] == "AWS::StepFunctions::StateMachine" for r in t.get("Resources", {}).values())]
    settings = json.loads(SETTINGS_FILE.read_text())
    with LauncherHarness(launcher_definition(template), settings) as harness:
        ssm = boto3.client("ssm", region_name=REGION)
        ssm.put_parameter(Name="/mltrain/platform-settings", Value=json.dumps(settings), Type="String")
        ssm.put_parameter(Name="/mltrain/state-machine-arn", Value=harness.state_machine_arn, Type="String")
        yield harness


def _submit(launcher: LauncherHarness, tmp_path: Path, request: dict, outcomes: list, name: str):
    sm.StateTaskServiceSageMaker.world = sm.ScriptedSageMaker(outcomes)
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    return run("submit", path, "--name", name, "--wait", "--interval", "0.05", "--region", REGION,
               env={"COLUMNS": "250"})


def test_capacity_error_then_success_on_the_fallback(launcher, tmp_path):
    result = _submit(launcher, tmp_path, job_request(), [sm.capacity_error(), sm.completed(train_loss=2.05)],
                     "cli-capacity")
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stdout.splitlines() if "execution=" in line]
    assert any("attempt=1" in p and "instance=ml.p4d.24xlarge" in p for p in progress)
    assert any("attempt=2" in p and "instance=ml.p5.48xlarge" in p for p in progress)
    assert "final metrics: train_loss=2.05" in result.stdout
    assert result.stdout.splitlines()[-1] == "succeeded cli-capacity"

    status = run("status", "cli-capacity", "--region", REGION, env={"COLUMNS": "250"})
    assert status.exit_code == 0, status.output
    rows = [line for line in status.stdout.splitlines() if "│" in line and "-a" in line]
    assert len(rows) == 2
    assert "ml.p4d.24xlarge" in rows[0] and "capacity" in rows[0] and "-> retry" in rows[0]
    assert "ml.p5.48xlarge" in rows[1] and "Completed" in rows[1]

    view = json.loads(run("status", "cli-capacity", "--json", "--region", REGION).stdout)
    names = [a["job_name"] for a in view["attempts"]]
    assert names == [c["TrainingJobName"] for c in sm.StateTaskServiceSageMaker.world.create_calls]


def test_user_code_error_fails_with_the_reason(launcher, tmp_path):
    result = _submit(launcher, tmp_path, job_request(), [sm.algorithm_error()], "cli-algorithm")
    assert result.exit_code == 1, result.output
    last = result.stdout.splitlines()[-1]
    assert last.startswith("failed cli-algorithm: ") and "AlgorithmError" in result.stdout
    assert len(sm.StateTaskServiceSageMaker.world.create_calls) == 1


def test_invalid_request_in_the_console_box_is_named_by_status(launcher, tmp_path):
    """A request that skipped trainctl's own check (pasted in the console) fails in Prepare; status says why."""
    sfn = boto3.client("stepfunctions", region_name=REGION)
    sm.StateTaskServiceSageMaker.world = sm.ScriptedSageMaker([])
    bad = job_request(instance={"type": "ml.p4d.24xlarge", "count": 0})
    sfn.start_execution(stateMachineArn=launcher.state_machine_arn, name="cli-invalid", input=json.dumps(bad))
    import time

    deadline = time.monotonic() + 30
    while run("status", "cli-invalid", "--json", "--region", REGION).stdout.count('"RUNNING"'):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = run("status", "cli-invalid", "--region", REGION, env={"COLUMNS": "250"})
    assert "FAILED" in status.stdout and "no training job launched yet" in status.stdout
    assert "RequestInvalid" in status.stdout and "instance.count" in status.stdout

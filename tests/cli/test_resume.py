"""`trainctl resume RUN REQUEST` against moto: the request goes to the launcher with `resume_run` set."""

from __future__ import annotations

import json

import pytest

from jobs.naming import new_run_id
from jobs.platform import PlatformSettings
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from tests.cli import machines
from tests.cli.conftest import DATA, run
from tests.cli.test_aws_commands import sfn, started_executions

RUN = new_run_id("gpt-small-ddp")


@pytest.fixture
def create(platform_doc) -> dict:
    request = parse_request(json.loads((DATA / "ddp.json").read_text()))
    return render_create_training_job(request, PlatformSettings.from_dict(platform_doc), run_id=RUN, attempt=1)


def test_resume_starts_an_execution_whose_request_resumes_the_run(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    result = run("resume", RUN, DATA / "ddp.json", "--name", "resume-1")
    assert result.exit_code == 0, result.output
    (execution,) = started_executions(machine)
    described = sfn().describe_execution(executionArn=execution["executionArn"])
    assert json.loads(described["input"]) == json.loads((DATA / "ddp.json").read_text()) | {"resume_run": RUN}


def test_resume_refuses_what_is_not_a_run_id_before_any_aws_call(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    result = run("resume", "gpt-small-ddp", DATA / "ddp.json")
    assert result.exit_code == 2 and "RUN: 'gpt-small-ddp' is not a run id" in result.stderr
    assert "Traceback" not in result.output and started_executions(machine) == []


def test_resume_refuses_a_request_that_resumes_another_run(deployed, create, tmp_path):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    other = new_run_id("gpt-small-ddp")
    request = json.loads((DATA / "ddp.json").read_text()) | {"resume_run": other}
    (tmp_path / "r.json").write_text(json.dumps(request))
    result = run("resume", RUN, tmp_path / "r.json")
    assert result.exit_code == 2 and f"sets resume_run {other!r}, not {RUN!r}" in result.stderr
    assert started_executions(machine) == []

"""submit, status, list, stop and logs against moto: real Step Functions executions, real history."""

from __future__ import annotations

import json
import time

import boto3
import pytest

from jobs.naming import new_run_id
from jobs.platform import PlatformSettings
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from tests.cli import machines
from tests.cli.conftest import DATA, REGION, run

FAST = ("--interval", "0.05")


@pytest.fixture
def create(platform_doc) -> dict:
    request = parse_request(json.loads((DATA / "ddp.json").read_text()))
    return render_create_training_job(request, PlatformSettings.from_dict(platform_doc),
                                      run_id=new_run_id(request.name), attempt=1)


def sfn():
    return boto3.client("stepfunctions", region_name=REGION)


def wait_for(arn: str, predicate, timeout: float = 20.0) -> dict:
    """Poll moto's executing interpreter (it runs the execution in a thread) until predicate(description)."""
    deadline = time.monotonic() + timeout
    while True:
        description = sfn().describe_execution(executionArn=arn)
        if predicate(description):
            return description
        assert time.monotonic() < deadline, f"execution stuck: {description['status']}"
        time.sleep(0.05)


def history(arn: str) -> list[dict]:
    return sfn().get_execution_history(executionArn=arn)["events"]


def started_executions(machine: str) -> list[dict]:
    return sfn().list_executions(stateMachineArn=machine)["executions"]


# ---- submit ---------------------------------------------------------------------------------------------


def test_submit_starts_an_execution_with_the_request_as_input(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    result = run("submit", DATA / "ddp.json", "--name", "run-1")
    assert result.exit_code == 0, result.output
    arn = f"{machine.replace(':stateMachine:', ':execution:')}:run-1"
    assert arn in result.stdout
    assert f"https://{REGION}.console.aws.amazon.com/states/home?region={REGION}#/v2/executions/details/{arn}" \
        in result.stdout
    described = sfn().describe_execution(executionArn=arn)
    assert json.loads(described["input"]) == json.loads((DATA / "ddp.json").read_text())


def test_submit_names_the_execution_after_the_request(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    assert run("submit", DATA / "ddp.json").exit_code == 0
    (execution,) = started_executions(machine)
    assert execution["name"].startswith("gpt-small-ddp-") and len(execution["name"]) <= 80


def test_submit_refuses_an_invalid_request_before_any_aws_call(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    result = run("submit", DATA / "invalid.json")
    assert result.exit_code == 2
    assert "spots: unknown field; did you mean 'spot'?" in result.stderr and "Traceback" not in result.output
    assert started_executions(machine) == []


def test_submit_refuses_what_the_platform_does_not_allow(deployed, create, tmp_path):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    request = json.loads((DATA / "ddp.json").read_text()) | {"instance": {"type": "ml.p3.2xlarge"}}
    (tmp_path / "r.json").write_text(json.dumps(request))
    result = run("submit", tmp_path / "r.json")
    assert result.exit_code == 2
    assert "instance.type: ml.p3.2xlarge is not allowed on this platform" in result.stderr
    assert started_executions(machine) == []


def test_submit_refuses_a_bad_execution_name_before_any_aws_call(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    result = run("submit", DATA / "ddp.json", "--name", "my run/1")
    assert result.exit_code == 2 and "--name 'my run/1' is not a valid execution name" in result.stderr
    assert started_executions(machine) == []


def test_submit_when_the_platform_is_not_deployed(aws):
    result = run("submit", DATA / "ddp.json")
    assert result.exit_code == 2
    assert "SSM parameter /mltrain/platform-settings not found in us-east-1" in result.stderr
    assert "Traceback" not in result.output


def test_submit_twice_with_one_name(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    assert run("submit", DATA / "ddp.json", "--name", "same").exit_code == 0
    # While it runs, the same name and input is idempotent (StartExecution returns the same execution).
    wait_for(f"{machine.replace(':stateMachine:', ':execution:')}:same", lambda d: d["status"] != "RUNNING")
    result = run("submit", DATA / "ddp.json", "--name", "same")
    assert result.exit_code == 2
    assert "an execution named same already exists" in result.stderr


def test_submit_wait_follows_the_execution_to_success(deployed, create):
    deployed(machines.training_machine(create, machines.SUMMARY))
    result = run("submit", DATA / "ddp.json", "--name", "ok", "--wait", *FAST)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    progress = [line for line in lines if "execution=" in line]
    # submit waits for the launcher's verdict before "started" (this stand-in machine may end meanwhile): what follows
    # is the run from there to its end.
    assert lines[0] == "started ok" and progress
    # The job the state machine created, with its status and the metrics SageMaker reported.
    assert any("attempt=1 job=ok-a1 instance=ml.g5.12xlarge job_status=Completed/Completed" in p for p in progress)
    assert any("train:progress=100" in p for p in progress)
    assert progress[-1].split("execution=")[1].startswith("SUCCEEDED")
    assert "model artifact s3://out/model.tar.gz" in result.stdout
    assert lines[-1] == "succeeded ok"


def test_submit_wait_exits_1_with_the_reason(deployed, create):
    deployed(machines.training_machine(create, machines.FAIL))
    result = run("submit", DATA / "ddp.json", "--name", "short", "--wait", *FAST)
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1].startswith(
        "failed short: CapacityExhausted: no ml.g5.12xlarge capacity after 3 attempts")


def test_submit_wait_reports_a_summary_that_says_failed(deployed, create):
    summary = {"Type": "Pass", "End": True, "Result": {
        "succeeded": False, "subject": "gpt-small-ddp failed: AlgorithmError in attempt 1", "message": "see logs"}}
    deployed(machines.training_machine(create, summary))
    result = run("submit", DATA / "ddp.json", "--name", "algo", "--wait", *FAST)
    assert result.exit_code == 1
    assert "gpt-small-ddp failed: AlgorithmError in attempt 1" in result.stdout


# ---- status and list -------------------------------------------------------------------------------------


def test_status_lists_every_attempt(deployed, create):
    machine = deployed(machines.training_machine(create, machines.SUCCEED, attempts=2))
    arn = sfn().start_execution(stateMachineArn=machine, name="two", input="{\"name\": \"gpt-small-ddp\"}")[
        "executionArn"]
    wait_for(arn, lambda d: d["status"] != "RUNNING")
    result = run("status", "two", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "SUCCEEDED" in result.stdout and "gpt-small-ddp" in result.stdout
    rows = [line for line in result.stdout.splitlines() if "two-a" in line and "│" in line]
    assert len(rows) == 2 and "two-a1" in rows[0] and "two-a2" in rows[1]
    assert all("ml.g5.12xlarge" in row and "Completed/Completed" in row for row in rows)
    assert "latest metrics: train:progress=100" in result.stdout
    assert "model: s3://" in result.stdout

    by_arn = run("status", arn, "--json")
    view = json.loads(by_arn.stdout)
    assert view["status"] == "SUCCEEDED"
    assert [a["job_name"] for a in view["attempts"]] == ["two-a1", "two-a2"]


def test_status_of_an_unknown_execution(deployed, create):
    deployed(machines.training_machine(create, machines.SUCCEED))
    result = run("status", "nope")
    assert result.exit_code == 2
    assert "ExecutionDoesNotExist" in result.stderr and "Traceback" not in result.output


def test_list_filters_by_status(deployed, create):
    machine = deployed(machines.training_machine(create, machines.FAIL))
    failed = sfn().start_execution(stateMachineArn=machine, name="failed-run", input="{}")["executionArn"]
    wait_for(failed, lambda d: d["status"] == "FAILED")
    running_machine = deployed(machines.training_machine(create, machines.WAIT_LONG), name="other")
    sfn().start_execution(stateMachineArn=running_machine, name="running-run", input="{}")

    everything = run("list", env={"COLUMNS": "200"})  # the SSM parameter now names the second machine
    assert everything.exit_code == 0, everything.output
    assert "running-run" in everything.stdout and "failed-run" not in everything.stdout

    first = run("list", "--state-machine", machine, "--status", "FAILED", env={"COLUMNS": "200"})
    assert "failed-run" in first.stdout and "FAILED" in first.stdout
    none = run("list", "--state-machine", machine, "--status", "SUCCEEDED", "--status", "RUNNING")
    assert none.exit_code == 0 and "no executions" in none.stdout
    bad = run("list", "--status", "DONE")
    assert bad.exit_code == 2 and "DONE" in bad.stderr


# ---- stop ------------------------------------------------------------------------------------------------


def test_stop_ends_the_execution(deployed, create):
    machine = deployed(machines.training_machine(create, machines.WAIT_LONG))
    arn = sfn().start_execution(stateMachineArn=machine, name="long", input="{}")["executionArn"]
    wait_for(arn, lambda d: any(e["type"] == "WaitStateEntered" for e in history(arn)))
    running = run("status", "long", env={"COLUMNS": "200"})
    assert "RUNNING" in running.stdout and "state      End" in running.stdout  # the Wait state's name
    assert "long-a1" in running.stdout
    result = run("stop", "long")
    assert result.exit_code == 0, result.output
    assert "stopped execution long" in result.stdout
    described = wait_for(arn, lambda d: d["status"] != "RUNNING")
    assert described["status"] == "ABORTED"
    again = run("stop", "long")
    assert again.exit_code == 0 and "is not running (ABORTED)" in again.stdout


def test_stop_also_stops_the_running_training_job(deployed, create, running_jobs):
    machine = deployed(machines.training_machine(create, machines.WAIT_LONG))
    arn = sfn().start_execution(stateMachineArn=machine, name="busy", input="{}")["executionArn"]
    wait_for(arn, lambda d: any(e["type"] == "WaitStateEntered" for e in history(arn)))
    running_jobs.mark_in_progress("busy-a1")
    result = run("stop", arn)
    assert result.exit_code == 0, result.output
    assert "stopping training job busy-a1" in result.stdout
    assert running_jobs.stopped == ["busy-a1"]
    assert wait_for(arn, lambda d: d["status"] != "RUNNING")["status"] == "ABORTED"


# ---- logs ------------------------------------------------------------------------------------------------


def _log(job: str, host: str, *messages: str) -> None:
    logs = boto3.client("logs", region_name=REGION)
    start_ms = int(time.time() * 1000) - 60_000  # CloudWatch (and moto) refuse events older than 14 days
    stream = f"{job}/{host}"
    logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
    logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=[
        {"timestamp": start_ms + i, "message": m} for i, m in enumerate(messages)])


@pytest.fixture
def log_group(aws):
    boto3.client("logs", region_name=REGION).create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")


def test_logs_of_a_job_by_name(deployed, create, log_group):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    arn = sfn().start_execution(stateMachineArn=machine, name="lg", input="{}")["executionArn"]
    wait_for(arn, lambda d: d["status"] == "SUCCEEDED")
    _log("lg-a1", "algo-1-1700000000", "[metrics] step=10 train_loss=2.5", "saved checkpoint step 10")
    _log("lg-a1", "algo-2-1700000000", "rank 8 ready")
    _log("lg-a10", "algo-1-1700000000", "another job's line")  # shares the prefix `lg-a1`
    result = run("logs", "lg-a1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("algo-1-1700000000 [metrics] step=10 train_loss=2.5")
    assert "algo-2-1700000000 rank 8 ready" in result.stdout
    assert "another job's line" not in result.stdout


def test_logs_of_an_execution_cover_every_attempt(deployed, create, log_group):
    machine = deployed(machines.training_machine(create, machines.SUCCEED, attempts=2))
    arn = sfn().start_execution(stateMachineArn=machine, name="ex", input="{}")["executionArn"]
    wait_for(arn, lambda d: d["status"] == "SUCCEEDED")
    _log("ex-a1", "algo-1-1", "first attempt interrupted")
    _log("ex-a2", "algo-1-2", "resumed from step 400")
    result = run("logs", "ex")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.index("== attempt 1: ex-a1 (ml.g5.12xlarge) ==") < text.index("first attempt interrupted") \
        < text.index("== attempt 2: ex-a2 (ml.g5.12xlarge) ==") < text.index("resumed from step 400")
    only_second = run("logs", "ex", "--attempt", "2")
    assert "resumed from step 400" in only_second.stdout and "first attempt" not in only_second.stdout
    too_far = run("logs", "ex", "--attempt", "3")
    assert too_far.exit_code == 2 and "has 2 attempt(s), not 3" in too_far.stderr


def test_logs_follow_stops_when_the_job_ends(deployed, create, log_group):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    arn = sfn().start_execution(stateMachineArn=machine, name="fo", input="{}")["executionArn"]
    wait_for(arn, lambda d: d["status"] == "SUCCEEDED")
    _log("fo-a1", "algo-1-1", "line one", "line two")
    result = run("logs", "fo", "--follow", *FAST)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("line one") == 1 and result.stdout.count("line two") == 1
    by_job = run("logs", "fo-a1", "-f", *FAST)
    assert by_job.exit_code == 0 and by_job.stdout.count("line two") == 1


def test_logs_before_any_job_logged(deployed, create, aws):
    machine = deployed(machines.training_machine(create, machines.SUCCEED))
    arn = sfn().start_execution(stateMachineArn=machine, name="quiet", input="{}")["executionArn"]
    wait_for(arn, lambda d: d["status"] == "SUCCEEDED")
    result = run("logs", "quiet-a1")
    assert result.exit_code == 0 and "no log lines for quiet-a1 yet" in result.stdout
    unknown = run("logs", "quiet-a7")
    assert unknown.exit_code == 2 and "no training job and no execution named quiet-a7" in unknown.stderr


def test_moto_still_lacks_stop_training_job():
    """The running_jobs fixture adds StopTrainingJob to moto; if moto grows its own, use it instead."""
    from moto.sagemaker.responses import SageMakerResponse

    assert not hasattr(SageMakerResponse, "stop_training_job")
    import moto

    assert moto.__version__ == "5.2.5"


def test_logs_follow_an_execution_across_attempts(deployed, create, log_group):
    machine = deployed(machines.training_machine(create, machines.SUCCEED, attempts=2))
    _log("fw-a1", "algo-1-1", "attempt one: interrupted at step 300")
    _log("fw-a2", "algo-1-1", "attempt two: resumed from step 300")
    sfn().start_execution(stateMachineArn=machine, name="fw", input="{}")
    result = run("logs", "fw", "--follow", *FAST)  # starts while the execution is still running
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.index("== attempt 1: fw-a1") < text.index("interrupted at step 300") \
        < text.index("== attempt 2: fw-a2") < text.index("resumed from step 300")
    assert text.count("resumed from step 300") == 1


# ---- platform settings from the deployed stack -------------------------------------------------------------


def test_render_reads_the_platform_settings_of_the_deployed_stack(deployed, platform_file):
    from_stack = run("render", DATA / "ddp.json")
    assert from_stack.exit_code == 0, from_stack.output
    from_file = run("render", DATA / "ddp.json", "--platform", platform_file)
    assert json.loads(from_stack.stdout) == json.loads(from_file.stdout)
    plan = run("plan", DATA / "ddp.json")
    assert plan.exit_code == 0 and "world size 8" in plan.stdout


def test_prefix_selects_another_deployment(aws, platform_doc, monkeypatch):
    other = platform_doc | {"name_prefix": "team2", "checkpoint_bucket": "team2-checkpoints"}
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name="/team2/platform-settings", Value=json.dumps(other), Type="String")
    missing = run("render", DATA / "ddp.json")
    assert missing.exit_code == 2 and "SSM parameter /mltrain/platform-settings not found" in missing.stderr
    by_option = json.loads(run("render", DATA / "ddp.json", "--prefix", "team2").stdout)
    monkeypatch.setenv("TRAINCTL_PREFIX", "team2")
    by_env = json.loads(run("render", DATA / "ddp.json").stdout)
    assert by_option == by_env
    assert by_env["TrainingJobName"].startswith("team2-")
    assert by_env["CheckpointConfig"]["S3Uri"].startswith("s3://team2-checkpoints/team2/")


def test_a_corrupt_settings_parameter_is_a_user_error(aws):
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name="/mltrain/platform-settings", Value="{not json", Type="String")
    result = run("render", DATA / "ddp.json")
    assert result.exit_code == 2 and "SSM parameter /mltrain/platform-settings does not hold JSON" in result.stderr

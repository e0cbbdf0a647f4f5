"""The Lambda handlers in-process: prepare -> decide ... -> summarize, with moto for DescribeTrainingJob."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import boto3
import pytest
from moto import mock_aws

from contract.container import ENV_RUN_ID
from contract.errors import RequestInvalid
from jobs import handler
from jobs.retry.run_state import RunState

from .conftest import ROOT, assert_valid_create_request

REQUEST = {
    "name": "gpt-350m-spot",
    "strategy": "fsdp",
    "model": "gpt",
    "model_size": "350m",
    "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/",
    "instance": {"type": "ml.p4d.24xlarge", "count": 2, "fallbacks": ["ml.p4de.24xlarge"]},
    "spot": True,
    "retry": {"capacity_wait_seconds": 1, "capacity_wait_max_seconds": 1, "interruption_wait_seconds": 0,
              "interruptions_before_on_demand": 2, "api_error_wait_seconds": 1, "max_attempts": 6},
}
EXECUTION = {"name": "0b5d7c1e-run", "start_time": "2026-11-21T08:00:00.000Z"}
CAPACITY = "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML " \
           "instance type."


@pytest.fixture(autouse=True)
def sagemaker(monkeypatch):
    """moto's SageMaker: decide looks up the attempt's job after a launch error, summarize stops a job left
    running; with no job of that name, the look-up finds none (as SageMaker answers an unknown name)."""
    for key, value in {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("sagemaker", region_name="us-east-1")


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1_795_248_000.0}  # 2026-11-21T08:00:00Z

    def tick(seconds=0):
        now["t"] += seconds
        return now["t"]

    monkeypatch.setattr(handler, "clock", lambda: now["t"])
    return tick


def roundtrip(state: dict) -> dict:
    """What Step Functions does between states: the state must be plain JSON."""
    return json.loads(json.dumps(state))


def after_failure(state: dict, failure: dict, request: dict = REQUEST) -> dict:
    """Decide's input after a failed Launch, as the state machine builds it: the request (the execution's
    input), the run state, and the Catch's {"Error", "Cause"}."""
    return roundtrip({"request": request, "run": state["run"], "failure": failure})


def failed(state, request: dict = REQUEST, **description) -> dict:
    """A job that ended: its description as the Cause (Decide reads it when it is there)."""
    job = {"TrainingJobName": state["run"]["job_name"], **description}
    return after_failure(state, {"Error": "States.TaskFailed", "Cause": json.dumps(job)}, request)


def decided(event: dict) -> dict:
    """Decide, and after a retry decision NextAttempt (relaunch: the next attempt's request, rendered after the
    wait), as the state machine runs them; the decision is kept beside the new attempt for the test to read."""
    out = roundtrip(handler.decide(event))
    if out["decision"]["action"] != "retry":
        return out
    launched = roundtrip(handler.relaunch({"request": event["request"], "run": out["run"],
                                           "decision": out["decision"]}))
    return {**launched, "decision": out["decision"]}


def completed(state, job: dict) -> dict:
    """Summarize's input after the Launch state succeeded: the job's description in the create request's place."""
    return roundtrip({**state, "launch": {"job": job}})


def test_a_run_through_capacity_interruptions_on_demand_and_success(platform_env, clock):
    state = roundtrip(handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION}))
    assert set(state) == {"run", "launch"}
    first = state["launch"]["create"]
    assert_valid_create_request(first)
    assert first["TrainingJobName"].endswith("-a1") and first["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert state["run"]["started_at"] == "2026-11-21T08:00:00Z"

    clock(600)
    state = decided(failed(state, TrainingJobStatus="Failed", SecondaryStatus="Failed", FailureReason=CAPACITY))
    assert state["decision"] == {"action": "retry", "wait_seconds": 1, "category": "capacity",
                                 "reason": state["decision"]["reason"],
                                 "next": {"instance_type": "ml.p4de.24xlarge", "spot": True, "infra_check": None}}
    assert state["launch"]["create"]["ResourceConfig"]["InstanceType"] == "ml.p4de.24xlarge"

    for expected_spot in (True, False):
        clock(3600)
        state = decided(failed(state, TrainingJobStatus="Stopped", SecondaryStatus="Interrupted",
                               TrainingTimeInSeconds=1800, BillableTimeInSeconds=600))
        assert state["decision"]["category"] == "spot_interruption"
        assert state["launch"]["create"]["EnableManagedSpotTraining"] is expected_spot

    names = [a["job_name"] for a in state["run"]["attempts"]]
    assert len(set(names)) == 4 and [n[-2:] for n in names] == ["a1", "a2", "a3", "a4"]
    assert {state["launch"]["create"]["CheckpointConfig"]["S3Uri"]} == {first["CheckpointConfig"]["S3Uri"]}
    assert_valid_create_request(state["launch"]["create"])

    clock(7200)
    # the .sync task's output lands in $.launch.job; the earlier "retry" decision is still in the state
    out = roundtrip(handler.summarize(completed(state, {
        "TrainingJobName": state["launch"]["create"]["TrainingJobName"], "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed", "TrainingTimeInSeconds": 7000, "BillableTimeInSeconds": 7000,
        "ModelArtifacts": {"S3ModelArtifacts": "s3://out/model.tar.gz"},
        "FinalMetricDataList": [{"MetricName": "train_loss", "Value": 2.25, "Timestamp": "2026-11-21T12:00:00Z"},
                                {"MetricName": "step", "Value": 5000.0, "Timestamp": "2026-11-21T12:00:00Z"}]})))
    assert out["succeeded"] is True
    assert len(out["subject"]) <= 100 and "succeeded (4 attempts)" in out["subject"]
    s = out["summary"]
    assert s["status"] == "Succeeded" and s["attempt_count"] == 4
    assert [a["status"] for a in s["attempts"]] == ["Failed", "Stopped", "Stopped", "Completed"]
    assert [a["category"] for a in s["attempts"]] == ["capacity", "spot_interruption", "spot_interruption", ""]
    assert [a["spot"] for a in s["attempts"]] == [True, True, True, False]
    assert s["instance_types_tried"] == ["ml.p4d.24xlarge", "ml.p4de.24xlarge"]
    assert s["interruptions"] == 2 and s["time_lost_to_interruptions_seconds"] == 3600
    assert s["final_metrics"] == {"train_loss": 2.25, "step": 5000.0}
    assert s["model_artifacts"] == "s3://out/model.tar.gz"
    assert s["billable_seconds"] == 600 + 600 + 7000
    assert s["elapsed_seconds"] == 600 + 3600 * 2 + 7200
    assert "Model: s3://out/model.tar.gz" in out["message"] and "train_loss=2.25" in out["message"]


def test_each_launch_renders_the_price_of_the_instances_it_launches_on(platform_env, clock, monkeypatch):
    """On a platform with an MLflow server, Prepare prices the request's type and NextAttempt the type the retry moved
    to (the capacity fallback), with the attempt's Spot; one Price List question per launch, for that type only."""
    import dataclasses

    from contract.container import ENV_PRICE

    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps(
        dataclasses.replace(platform_env, mlflow_tracking_uri="https://mlflow.example.com").to_dict()))
    asked = []

    def prices(region, types, **patience):  # the Price List API (moto has none), as jobs.prices reads it
        asked.append(types)
        return {"ml.p4d.24xlarge": 37.6885, "ml.p4de.24xlarge": 40.966}

    monkeypatch.setattr(handler, "training_prices", prices)
    state = roundtrip(handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION}))
    count = state["launch"]["create"]["ResourceConfig"]["InstanceCount"]
    assert json.loads(state["launch"]["create"]["Environment"][ENV_PRICE]) == {
        "usd_per_hour": round(count * 37.6885, 4), "spot": True}
    clock(600)
    state = decided(failed(state, TrainingJobStatus="Failed", SecondaryStatus="Failed", FailureReason=CAPACITY))
    assert state["launch"]["create"]["ResourceConfig"]["InstanceType"] == "ml.p4de.24xlarge"
    assert json.loads(state["launch"]["create"]["Environment"][ENV_PRICE]) == {
        "usd_per_hour": round(count * 40.966, 4), "spot": True}
    assert asked == [["ml.p4d.24xlarge"], ["ml.p4de.24xlarge"]]


def test_user_error_fails_after_one_attempt(platform_env, clock):
    state = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION})
    state = roundtrip(handler.decide(failed(state, TrainingJobStatus="Failed", SecondaryStatus="Failed",
                                            FailureReason="AlgorithmError: ExecuteUserScriptError: exit code 1"), None))
    assert state["decision"]["action"] == "fail" and state["decision"]["category"] == "user_error"
    assert len(state["run"]["attempts"]) == 1
    out = handler.summarize(state)
    assert out["succeeded"] is False and out["summary"]["reason"].startswith("the training code or its data failed")
    assert out["subject"] == "Training run gpt-350m-spot failed: user_error"
    assert out["summary"]["model_artifacts"] is None


def test_quota_at_create_then_success(platform_env, clock):
    state = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION})
    state = decided(after_failure(state, {
        "Error": "SageMaker.ResourceLimitExceededException",
        # A limit that frees up when other jobs end: worth waiting for (a limit of 0 is not; see below).
        "Cause": "The account-level service limit 'ml.p4d.24xlarge for spot training job usage' is 2 Instances, "
                 "with current utilization of 2 Instances and a request delta of 1 Instances."}))
    assert state["decision"]["action"] == "retry" and state["decision"]["category"] == "quota"
    assert state["run"]["attempts"][0]["status"] == "NotCreated"
    assert state["launch"]["create"]["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge", "quota keeps the type"


def test_bad_input_raises_request_invalid_naming_the_field(platform_env):
    bad = {**REQUEST, "instance": {"type": "ml.p4d.24xlarge", "count": 0}}
    with pytest.raises(RequestInvalid) as info:
        handler.prepare({"state_shape": handler.STATE_SHAPE, "request": bad, "execution": EXECUTION})
    assert str(info.value) == "instance.count: must be at least 1, got 0"
    with pytest.raises(RequestInvalid, match="request: the execution input needs"):
        handler.prepare({"state_shape": handler.STATE_SHAPE, "execution": EXECUTION})
    with pytest.raises(RequestInvalid, match="not allowed on this platform"):
        handler.prepare({"state_shape": handler.STATE_SHAPE, "request": {**REQUEST, "instance": {"type": "ml.p3.2xlarge"}}, "execution": EXECUTION})


def test_missing_platform_settings_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("PLATFORM_SETTINGS", raising=False)
    with pytest.raises(RuntimeError, match="PLATFORM_SETTINGS is not set"):
        handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST})


@mock_aws
def test_decide_describes_the_job_when_the_cause_is_a_plain_message(platform_env, clock, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    state = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION})
    sm = boto3.client("sagemaker", region_name="us-east-1")
    sm.create_training_job(**state["launch"]["create"])
    # moto's jobs complete at once; make this one look like a Spot reclaim (reaches into moto's model).
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    fake = sagemaker_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].training_jobs[state["launch"]["create"]["TrainingJobName"]]
    fake.environment = state["launch"]["create"]["Environment"]  # SageMaker returns it; moto drops it
    fake.training_job_status, fake.secondary_status = "Stopped", "Interrupted"
    assert sm.describe_training_job(TrainingJobName=fake.training_job_name)["SecondaryStatus"] == "Interrupted"

    state = decided(after_failure(state, {"Error": "States.TaskFailed", "Cause": "Training job did not complete"}))
    assert state["decision"]["category"] == "spot_interruption" and state["decision"]["action"] == "retry"
    assert state["run"]["attempts"][0]["status"] == "Stopped"

    # a job that was never created: describe finds nothing, the message decides (internal -> retry)
    state = roundtrip(handler.decide(after_failure(state, {"Error": "States.TaskFailed",
                                                           "Cause": "InternalServerError: try again"})))
    assert state["decision"]["category"] == "internal"


def _jobs_imports(path) -> set[str]:
    """The jobs modules one file imports, lazily or not."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("jobs.")}
        elif isinstance(node, ast.ImportFrom) and node.module == "jobs":
            found |= {f"jobs.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jobs."):
            found.add(node.module)
    return found


def test_jobs_modules_import_each_other_without_cycles():
    graph = {f"jobs.{p.stem}": _jobs_imports(p) for p in (ROOT / "jobs").glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_jobs_imports_nothing_of_the_project_and_only_the_standard_library():
    jobs_dir = ROOT / "jobs"
    allowed_third_party = {"boto3", "botocore"}  # only inside handler.describe_training_job
    stdlib = set(sys.stdlib_module_names)
    for path in jobs_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib or top in ("jobs", "contract") or top in allowed_third_party and path.name == "handler.py", \
                    f"{path.name} imports {name}"
    # and importing the handler loads no boto3 (cold start, and the Lambda needs no bundled dependencies)
    code = ("import sys, jobs.handler, jobs.render.training_job, jobs.request.parse, jobs.retry.policy, jobs.planning.auto_strategy, jobs.reference; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('boto3', 'botocore', 'cli', 'training', 'stacks', 'platform_constructs')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("failure", "action", "category"), [
    ({"Error": "SageMaker.AmazonSageMakerException", "Cause": "Rate exceeded (Service: AmazonSageMaker; Status Code: "
      "400; Error Code: ThrottlingException; Request ID: 1; Proxy: null)"}, "retry", "throttling"),
    ({"Error": "States.TaskFailed", "Cause": json.dumps({
        "TrainingJobName": "x", "TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped",
        "SecondaryStatusTransitions": [{"Status": "Training", "StartTime": 1795248000000,
                                        "EndTime": 1795248600000}, {"Status": "Stopped"}]})}, "retry", "interruption"),
    ({"Error": "States.TaskFailed", "Cause": json.dumps({
        "TrainingJobName": "x", "TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
        "FailureReason": "InternalServerError: We encountered an internal error. Please try again."})},
     "retry", "internal"),
])
def test_decisions_from_the_shapes_the_sync_task_produces(platform_env, clock, failure, action, category):
    state = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION})
    out = roundtrip(handler.decide(after_failure(state, failure)))
    assert (out["decision"]["action"], out["decision"]["category"]) == (action, category)
    assert len(out["run"]["attempts"]) == 1  # the next attempt is rendered after the wait (NextAttempt), not here
    out = decided(after_failure(state, failure))
    assert len(out["run"]["attempts"]) == (2 if action == "retry" else 1)
    summary = handler.summarize(out)
    assert summary["succeeded"] is False  # no job has completed yet
    if action == "fail":
        assert summary["summary"]["category"] == category and summary["summary"]["reason"]


def test_attempts_exhausted_end_the_run_with_the_reason(platform_env, clock):
    request = {**REQUEST, "retry": {**REQUEST["retry"], "max_attempts": 2}}
    state = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request, "execution": EXECUTION})
    capacity = {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "FailureReason": CAPACITY}
    state = decided(failed(state, request, **capacity))
    assert state["decision"]["action"] == "retry"
    state = decided(failed(state, request, **capacity))
    assert state["decision"]["action"] == "fail"
    out = handler.summarize(state)
    assert out["summary"]["reason"].startswith("attempts exhausted (2 of 2)")
    assert [a["instance_type"] for a in out["summary"]["attempts"]] == ["ml.p4d.24xlarge", "ml.p4de.24xlarge"]
    assert out["subject"] == "Training run gpt-350m-spot failed: capacity"


def test_the_run_ends_without_stopping_a_job_that_took_its_name(platform_env, clock, monkeypatch):
    state = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": REQUEST, "execution": EXECUTION})
    run = RunState.from_dict(state["run"])
    other = {"TrainingJobName": run.current.job_name, "TrainingJobStatus": "InProgress",
             "Environment": {ENV_RUN_ID: "another-run-0000000000000000"}}
    stops = []
    monkeypatch.setattr(handler, "look_up_training_job", lambda name, region=None: (other, ""))
    monkeypatch.setattr(handler, "stop_training_job", lambda name: stops.append(name) or "")
    assert handler.stop_jobs_left_running(run) == ([], [], [])
    assert stops == [] and run.current.status == "NotCreated"
    # Decide does not wait on it either: the run retries under a fresh name.
    retried = decided(after_failure(state, {
        "Error": "SageMaker.ResourceInUseException", "Cause": "Training job names must be unique (ResourceInUse)"}))
    assert retried["decision"]["action"] == "retry" and retried["decision"]["category"] == "internal"
    assert retried["launch"]["create"]["TrainingJobName"] != state["launch"]["create"]["TrainingJobName"]
    assert retried["launch"]["create"]["Environment"][ENV_RUN_ID] == state["run"]["run_id"]
    assert retried["run"]["attempts"][0]["status"] == "NotCreated"
    assert stops == []

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

from jobs.retry.policy import HISTORY_LIMIT
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


INTERRUPTED = {"step": 1400, "startup_s": 100, "train_s": 1500, "checkpoint_s": 60, "eval_s": 30,
               "checkpoint_age_s": 240}
FINISHED = {"step": 3000, "startup_s": 200, "train_s": 1800, "checkpoint_s": 100, "eval_s": 50,
            "checkpoint_age_s": 10}


def test_runs_and_show_account_for_a_run_resumed_once(launcher, tmp_path):
    """A Spot run that spends its one attempt, resumed on demand: one run of two executions, whose record
    adds both (goodput, losses, cost with --prices FILE) and whose chart is drawn."""
    import dataclasses

    request = job_request(spot=True, retry={**FAST_RETRY, "max_attempts": 1})
    interrupted = dataclasses.replace(sm.spot_interrupted(), metrics=INTERRUPTED, training_seconds=1800,
                                      billable_seconds=600)
    first = _submit(launcher, tmp_path, request, [interrupted], "record-first")
    assert first.exit_code == 1, first.output
    listed = json.loads(run("runs", "--json", "--prices", "none", "--region", REGION).stdout)
    (ended,) = [r for r in listed if r["executions"][-1]["name"] == "record-first"]
    assert ended["status"] == "ended" and len(ended["attempts"]) == 1
    run_id = ended["run_id"]

    sm.StateTaskServiceSageMaker.world = sm.ScriptedSageMaker(
        [dataclasses.replace(sm.completed(), metrics=FINISHED, training_seconds=2400)])
    (tmp_path / "on-demand.json").write_text(json.dumps(request | {"spot": False}))
    resumed = run("resume", run_id, tmp_path / "on-demand.json", "--name", "record-resumed", "--wait",
                  "--interval", "0.05", "--region", REGION)
    assert resumed.exit_code == 0, resumed.output

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"ml.p4d.24xlarge": 36.0}))
    listed = json.loads(run("runs", "--json", "--prices", str(prices), "--region", REGION).stdout)
    (view,) = [r for r in listed if r["run_id"] == run_id]
    assert view["status"] == "completed"
    assert [e["name"] for e in view["executions"]] == ["record-first", "record-resumed"]
    assert [a["attempt"] for a in view["attempts"]] == [1, 2] and [a["spot"] for a in view["attempts"]] == [True, False]
    record, count = view["record"], view["attempts"][0]["instance_count"]
    # held 1800 + 2400 s per instance; productive (1500 - 240) + 1800; redone 240 (the checkpoint's age)
    assert record["held_instance_seconds"] == 4200 * count
    assert record["instance_seconds"]["redone"] == 240 * count
    assert record["goodput"] == pytest.approx((1260 + 1800) / 4200, abs=1e-4)
    assert record["step"] == 3000
    # $36/h per instance: Spot bills 600 of its 1800 s, on demand all 2400 s
    rate = 36.0 * count / 3600
    assert record["cost"] == {"on_demand_usd": round(2400 * rate, 2), "spot_usd": round(600 * rate, 2),
                              "spot_savings_usd": round(1200 * rate, 2), "total_usd": round(3000 * rate, 2),
                              "unpriced": []}

    chart = tmp_path / "run.png"
    shown = run("show", run_id, "--prices", str(prices), "--chart", str(chart), "--region", REGION,
                env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert f"goodput   {record['goodput']:.0%}" in shown.stdout or f"{record['goodput']:.0%}" in shown.stdout
    assert "redone" in shown.stdout and f"${record['cost']['total_usd']:,.2f}" in shown.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Where the run's TensorBoard event files are (the request's default), and the command that opens them.
    said = " ".join(shown.stdout.split())
    assert f"/{run_id}/tensorboard/: aws s3 sync s3://" in said and f"tensorboard --logdir tensorboard/{run_id}" in said

    missing = run("show", "gpt-125m-fsdp-aaaaaaaaaaaaaaaa", "--prices", "none", "--region", REGION)
    assert missing.exit_code == 2 and "no run gpt-125m-fsdp-aaaaaaaaaaaaaaaa" in missing.stderr
    assert "Traceback" not in missing.output


def _run_of(execution: str) -> dict:
    listed = json.loads(run("runs", "--json", "--prices", "none", "--region", REGION).stdout)
    return next(r for r in listed if any(e["name"] == execution for e in r["executions"]))


def test_resume_without_a_request_continues_with_the_runs_own(launcher, tmp_path):
    request = job_request(retry={**FAST_RETRY, "max_attempts": 1})
    assert _submit(launcher, tmp_path, request, [sm.internal_error()], "own-first").exit_code == 1
    run_id = _run_of("own-first")["run_id"]
    sm.StateTaskServiceSageMaker.world = sm.ScriptedSageMaker([sm.completed()])
    resumed = run("resume", run_id, "--name", "own-resumed", "--wait", "--interval", "0.05", "--region", REGION)
    assert resumed.exit_code == 0, resumed.output
    sfn = boto3.client("stepfunctions", region_name=REGION)
    arn = launcher.state_machine_arn.replace(":stateMachine:", ":execution:") + ":own-resumed"
    assert json.loads(sfn.describe_execution(executionArn=arn)["input"]) == request | {"resume_run": run_id}
    view = _run_of("own-resumed")
    assert view["run_id"] == run_id and [a["attempt"] for a in view["attempts"]] == [1, 2]
    assert view["status"] == "completed"


def test_resume_refuses_a_run_waiting_between_attempts(launcher, tmp_path):
    """No job of the run runs while its execution waits out a capacity shortage: the launcher's job check
    cannot see it, trainctl's execution check does. The resumes run while the execution is held in its Backoff."""
    request = job_request(retry={**FAST_RETRY, "capacity_wait_seconds": 20, "capacity_wait_max_seconds": 20})
    (tmp_path / "r.json").write_text(json.dumps(request))
    answers = []

    def while_waiting(arn: str, state: str, seconds: float) -> None:
        if state == "Backoff":
            run_id = _run_of("waiting")["run_id"]
            answers.extend((run_id, run("resume", run_id, *args, "--region", REGION))
                           for args in ((), (str(tmp_path / "r.json"),)))

    launcher.on_wait = while_waiting
    try:
        launcher.run(request, [sm.capacity_error(), sm.completed()], name="waiting")
    finally:
        launcher.on_wait = None
    assert len(answers) == 2
    for run_id, refused in answers:
        assert refused.exit_code == 2, refused.output
        assert f"run {run_id} is still active: execution waiting is RUNNING" in refused.stderr
        assert "trainctl stop waiting" in refused.stderr


def test_resume_finds_the_runs_driver_in_the_registry_however_many_executions_came_since(launcher, tmp_path):
    """The run's driver waits between attempts while newer executions start: `--limit 1` scans none of the run's
    executions, and the run registry still names the driver, so the resume is refused before anything starts."""
    request = job_request(retry={**FAST_RETRY, "capacity_wait_seconds": 20, "capacity_wait_max_seconds": 20})
    answers = []

    def while_waiting(arn: str, state: str, seconds: float) -> None:
        if state == "Backoff" and arn.endswith(":driver-waiting"):
            newer = launcher.start(job_request(), name="newer-run")
            launcher.wait(newer)
            run_id = json.loads(launcher.sfn.get_execution_history(executionArn=arn)["events"][-1].get(
                "stateEnteredEventDetails", {}).get("input", "{}")).get("run", {}).get("run_id")
            answers.append((run_id, run("resume", run_id, "--limit", "1", "--region", REGION)))

    launcher.on_wait = while_waiting
    try:
        launcher.run(request, [sm.capacity_error(), sm.completed(), sm.completed()], name="driver-waiting")
    finally:
        launcher.on_wait = None
    ((run_id, refused),) = answers
    assert run_id and refused.exit_code == 2, refused.output
    assert f"run {run_id} is still active: execution driver-waiting is RUNNING" in refused.stderr


def test_a_job_that_completed_as_its_execution_was_stopped_reads_completed(launcher):
    """A stop that arrives as the job completes: the execution is ABORTED without a summary, but the run is listed
    completed (its job says so), not resumable."""
    world = launcher.new_world([sm.completed()])
    world.on_look = lambda name, status: launcher.stop(arn) if status == "Uploading" else None
    arn = launcher.start(job_request(), name="stopped-as-completed")
    result = launcher.wait(arn, deliver=False)
    assert result.status == "ABORTED"
    for name in result.jobs:  # the job goes on to its end, as SageMaker's would: it was never stopped
        world.look(name)
    assert set(world.statuses().values()) == {"Completed"}
    view = _run_of("stopped-as-completed")
    assert view["status"] == "completed", view


def test_runs_keep_what_a_run_measured_and_plan_is_corrected_by_it(launcher, tmp_path, monkeypatch):
    """A run whose job printed its step time, found by `trainctl runs`: its measured section is kept in trainctl's
    cache, `show` says it, and `trainctl plan` of the same model on the same instance type corrects its figures
    by the run's measured/predicted ratio."""
    from contract.metrics import MFU, STEP_TIME_MS
    from jobs.planning.measured import measured_section

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    request = job_request(instance={"type": "ml.p4d.24xlarge", "count": 2},
                          hyperparameters={"global_batch_size": 256, "micro_batch_size": 4})
    probe = {"ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
             "HyperParameters": {k: json.dumps(v) for k, v in
                                 {"strategy": "fsdp", "model": "gpt", "model_size": "125m",
                                  **request["hyperparameters"]}.items()},
             "FinalMetricDataList": [{"MetricName": STEP_TIME_MS, "Value": 1.0}]}
    predicted_ms = measured_section(probe)["predicted_step_time_s"] * 1e3
    done = _submit(launcher, tmp_path, request, [sm.completed(**{STEP_TIME_MS: 1.5 * predicted_ms, MFU: 0.2})],
                   "measured-run")
    assert done.exit_code == 0, done.output

    view = _run_of("measured-run")
    (measured,) = view["measured"]
    assert measured["measured_over_predicted"] == pytest.approx(1.5, abs=1e-3)
    cached = json.loads((tmp_path / "cache" / "trainctl" / "measured-runs.json").read_text())
    assert [m["job_name"] for m in cached] == [measured["job_name"]]
    shown = run("show", view["run_id"], "--prices", "none", "--region", REGION, env={"COLUMNS": "250"})
    assert "measured" in shown.stdout and "1.5x its figure" in shown.stdout

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(request))
    plain = json.loads(run("plan", path, "--platform", SETTINGS_FILE, "--prices", "none", "--runs", "none",
                           "--json").stdout)
    fixed = json.loads(run("plan", path, "--platform", SETTINGS_FILE, "--prices", "none", "--json").stdout)
    pick = {c["strategy"]: c for c in fixed["candidates"] if (c["instance_type"], c["instance_count"])
            == ("ml.p4d.24xlarge", 2)}
    before = {c["strategy"]: c for c in plain["candidates"] if (c["instance_type"], c["instance_count"])
              == ("ml.p4d.24xlarge", 2)}
    assert pick["fsdp"]["measured_runs"]["count"] == 1
    assert pick["fsdp"]["throughput"] == pytest.approx(before["fsdp"]["throughput"] / 1.5, rel=1e-3)


def test_a_run_handed_over_near_the_history_limit_is_followed_and_counted_once(launcher, tmp_path, monkeypatch):
    """The first execution's history is said to be at the limit when its spot attempt is interrupted: it hands the
    run over, and the successor launches the second attempt. `submit --wait` follows the run into the successor and
    ends with its outcome; `show` lists one run whose attempts are counted once, the first execution as continued."""
    monkeypatch.setattr("jobs.handler.history_length",
                        lambda arn: HISTORY_LIMIT if arn.endswith(":handed-over") else 10)
    submitted = _submit(launcher, tmp_path, job_request(spot=True), [sm.spot_interrupted(), sm.completed()],
                        "handed-over")
    assert submitted.exit_code == 0, submitted.output
    assert "the run goes on in execution " in submitted.stdout and "succeeded" in submitted.stdout
    listed = json.loads(run("runs", "--json", "--prices", "none", "--region", REGION).stdout)
    (view,) = [r for r in listed if r["executions"][0]["name"] == "handed-over"]
    assert view["status"] == "completed"
    assert [(e["name"] == "handed-over", e["continued_in"] != "") for e in view["executions"]] == [
        (True, True), (False, False)]
    assert [(a["attempt"], a["status"]) for a in view["attempts"]] == [(1, "Stopped"), (2, "Completed")]
    shown = run("show", view["run_id"], "--prices", "none", "--region", REGION, env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and "handed-over (continued)" in shown.stdout, shown.output
    status = run("status", "handed-over", "--region", REGION, env={"COLUMNS": "250"})
    assert "continued handed-over" in status.stdout and "went on in execution" in status.stdout, status.output


def test_what_prepare_would_refuse_is_refused_where_it_was_asked(launcher, tmp_path):
    """A completed run, or another model, is refused by trainctl before any execution starts; what only the launcher
    can judge (a run it finds no job of) is Prepare's verdict, which trainctl waits for instead of saying "started"."""
    sfn = boto3.client("stepfunctions", region_name=REGION)
    done = _submit(launcher, tmp_path, job_request(), [sm.completed()], "done-first")
    assert done.exit_code == 0, done.output
    run_id = _run_of("done-first")["run_id"]
    before = len(sfn.list_executions(stateMachineArn=launcher.state_machine_arn)["executions"])

    completed = run("resume", run_id, "--name", "done-again", "--region", REGION)
    assert completed.exit_code == 2 and f"run {run_id} completed (execution done-first)" in completed.stderr
    assert "init_from_run" in completed.stderr and completed.stdout == ""

    failed = _submit(launcher, tmp_path, job_request(), [sm.algorithm_error()], "failed-first")
    assert failed.exit_code == 1, failed.output
    failed_run = _run_of("failed-first")["run_id"]
    before += 1
    (tmp_path / "other-model.json").write_text(json.dumps(job_request(model_size="1b")))
    other = run("resume", failed_run, tmp_path / "other-model.json", "--name", "other-model", "--region", REGION)
    assert other.exit_code == 2 and "trains gpt 1b, but run" in other.stderr and "trained gpt 125m" in other.stderr
    assert len(sfn.list_executions(stateMachineArn=launcher.state_machine_arn)["executions"]) == before

    (tmp_path / "r.json").write_text(json.dumps(job_request()))
    unknown = "gpt-125m-fsdp-bbbbbbbbbbbbbbbb"
    refused = run("resume", unknown, tmp_path / "r.json", "--name", "unknown-run", "--region", REGION)
    assert refused.exit_code == 2, refused.output
    assert "the launcher refused unknown-run: resume_run: no training job of run" in refused.stderr
    assert "started" not in refused.output and "Traceback" not in refused.output


def test_a_launched_job_writes_tensorboard_events_and_an_mlflow_run(launcher, tmp_path, monkeypatch, mlflow_server):
    """With an MLflow server in the platform settings, the CreateTrainingJob the launcher sends names it and the
    platform's (team's) own experiment; that very request, run by the container emulator (torchrun, one rank), writes
    TensorBoard events and logs an MLflow run whose values equal its metrics file, with its parameters, where it
    ran and its model, calling nothing the execution role is not granted."""
    from cli.container_emulator import run_local
    from contract.container import ENV_MLFLOW_EXPERIMENT, ENV_MLFLOW_TRACKING_URI, ENV_PRICE, ENV_RUN_ID
    from prepare.corpus import prepare
    from tests.tracking import check_run, tensorboard_problems
    from training.metrics.mlflow_run import COST_TAG, INSTANCE_HOURS_TAG, RUN_ID_TAG

    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps({**launcher.settings, "mlflow_tracking_uri": mlflow_server.uri}))
    # moto has no Price List API: the launch's price as jobs.handler.training_prices reads it (tests/jobs/outcome);
    # 3,600 USD an hour (not m5's) so that the cost is the seconds the job ran, well above the tags' rounding.
    monkeypatch.setattr("jobs.handler.training_prices", lambda region, types, **kw: {"ml.m5.xlarge": 3600.0})
    request = job_request(name="gpt-tiny-tracked", model_size="tiny", instance={"type": "ml.m5.xlarge", "count": 1},
                          validation_dataset="s3://mltrain-datasets-123456789012-us-east-1/datasets/tokens-val/",
                          hyperparameters={"max_steps": 4, "micro_batch_size": 2, "seq_len": 32, "log_interval": 1,
                                           "eval_interval": 2, "precision": "fp32"})
    result = _submit(launcher, tmp_path, request, [sm.completed()], "cli-tracked")
    assert result.exit_code == 0, result.output
    create = sm.StateTaskServiceSageMaker.world.create_calls[-1]
    env = create["Environment"]
    assert (env[ENV_MLFLOW_TRACKING_URI], env[ENV_MLFLOW_EXPERIMENT]) == (mlflow_server.uri, launcher.settings["name_prefix"])
    assert json.loads(env[ENV_PRICE]) == {"usd_per_hour": 3600.0, "spot": False}

    corpus = tmp_path / "corpus"
    prepare(corpus, val_fraction=0.25, max_bytes=300_000, shard_bytes=200_000)
    work, since = tmp_path / "job", mlflow_server.mark()
    assert run_local(create, workdir=work, nproc=1,
                     data_dirs={"train": corpus / "train", "validation": corpus / "validation"}) == 0
    records = [json.loads(line) for line in (work / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert not (problems := tensorboard_problems(work / "output" / "tensorboard", records)), problems
    run_ = check_run(mlflow_server, since, {RUN_ID_TAG: env[ENV_RUN_ID]}, records,
                     {"strategy": "fsdp", "max_steps": "4", "seq_len": "32", "request.name": "gpt-tiny-tracked",
                      "request.dataset": request["dataset"], "request.spot": "false"},
                     work / "model", instance_type="ml.m5.xlarge")
    from mlflow import MlflowClient

    assert MlflowClient(mlflow_server.uri).get_experiment(run_.info.experiment_id).name == launcher.settings["name_prefix"]
    # Its cost: the price the launcher rendered times the hours it ran (one instance), to the tags' rounding (6
    # decimals of an hour: 0.0036 s). The run's own length is the machine's: 0.9 s on an idle one, so the hours are
    # only asked to be well above that rounding (a bound of 1 s failed there).
    seconds = 3600 * float(run_.data.tags[INSTANCE_HOURS_TAG])
    assert seconds > 0.1 and abs(float(run_.data.tags[COST_TAG]) - seconds) < 0.005

"""A run's MLflow run when things go wrong: a resumed attempt, a server that does not answer, an image without the
client, a request that tries to send its runs elsewhere. The package's own MlflowRun against a real tracking server
(tests/tracking.py), without training: what it is handed is what the loop hands it."""

from __future__ import annotations

import json
import os
import sys

import pytest

from contract.container import (
    ENV_EPOCH,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_TRACKING_URI,
    ENV_PRICE,
    ENV_RUN_ID,
)
from tests.tracking import logged_run
from tests.training.helpers import free_port
from training.metrics.mlflow_run import (
    ATTEMPT_TAG,
    COST_BASIS_TAG,
    COST_TAG,
    HTTP_DEFAULTS,
    INSTANCE_HOURS_TAG,
    MODEL_DIR_TAG,
    ON_DEMAND,
    RUN_ID_TAG,
    SPOT,
    STATUS_TAG,
    TEAM_TAG,
    MlflowRun,
)

CONFIG = {"strategy": "fsdp", "grad_accum": 1, "micro_batch_size": 2, "lr": 0.001}


@pytest.fixture(autouse=True)
def _http_defaults_undone(monkeypatch):
    """MlflowRun sets its HTTP defaults in the process's environment (a job's rank 0 is its own process); here
    monkeypatch holds them, so no other test of the worker inherits them."""
    for name, value in HTTP_DEFAULTS.items():
        monkeypatch.setenv(name, value)


def _env(uri: str, run_id: str, attempt: int) -> dict[str, str]:
    return {ENV_MLFLOW_TRACKING_URI: uri, ENV_MLFLOW_EXPERIMENT: "mltrain--a", ENV_RUN_ID: run_id,
            ENV_EPOCH: str(attempt), "SM_HOSTS": json.dumps(["algo-1", "algo-2"]),
            "SM_CURRENT_INSTANCE_TYPE": "ml.p5.48xlarge"}


def test_a_resumed_run_logs_on_into_the_same_mlflow_run(mlflow_server, tmp_path):
    """Attempt 1 is stopped (a Spot reclaim); attempt 2, on the same run id, finds its MLflow run: RUNNING again, its
    steps after the first's, a parameter the resume re-planned kept as it was with the change as a tag (MLflow never
    changes a logged parameter), the instance-hours of both attempts, FINISHED with the model."""
    run_id = "gpt-resumed-0123456789abcdef"
    first = MlflowRun.from_environment(CONFIG, _env(mlflow_server.uri, run_id, 1), is_main=True)
    first.write({"step": 10, "train_loss": 3.5})
    first.end("stopped")
    _, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert run.info.status == "KILLED" and run.data.tags[STATUS_TAG] == "stopped"
    hours_after_first = float(run.data.tags[INSTANCE_HOURS_TAG])

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "config.json").write_text("{}")
    second = MlflowRun.from_environment({**CONFIG, "grad_accum": 2}, _env(mlflow_server.uri, run_id, 2), is_main=True)
    _, running, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert running.info.run_id == run.info.run_id and running.info.status == "RUNNING"
    second.write({"step": 20, "train_loss": 2.5})
    second.end("completed", model / "model.safetensors")
    client, run, history = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert run.info.status == "FINISHED" and run.data.tags[ATTEMPT_TAG] == "2"
    assert history["train_loss"] == [(10, 3.5), (20, 2.5)]
    assert run.data.params["grad_accum"] == "1" and run.data.tags["changed.grad_accum"] == "1 -> 2 (attempt 2)"
    assert float(run.data.tags[INSTANCE_HOURS_TAG]) > hours_after_first
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "model")) == [
        "model/config.json", "model/model.safetensors"]
    assert client.get_experiment(run.info.experiment_id).name == run.data.tags[TEAM_TAG] == "mltrain--a"


def test_a_failed_attempt_ends_its_mlflow_run_failed(mlflow_server):
    # What the loop hands end() when the attempt raised (training.loop.train's finally): no model, "failed".
    tracked = MlflowRun.from_environment(CONFIG, _env(mlflow_server.uri, "gpt-failed-0123456789abcdef", 1), is_main=True)
    tracked.write({"step": 3, "train_loss": float("nan")})
    tracked.end("failed")
    client, run, history = logged_run(mlflow_server.uri, {RUN_ID_TAG: "gpt-failed-0123456789abcdef"})
    assert run.info.status == "FAILED" and run.data.tags[STATUS_TAG] == "failed"
    assert client.list_artifacts(run.info.run_id, "model") == [] and len(history["train_loss"]) == 1


def test_a_model_too_large_to_copy_is_named_not_copied(mlflow_server, tmp_path, monkeypatch):
    import training.metrics.mlflow_run as mlflow_run

    monkeypatch.setattr(mlflow_run, "MAX_MODEL_ARTIFACT_BYTES", 4)
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    run_id = "gpt-large-0123456789abcdef"
    tracked = MlflowRun.from_environment(CONFIG, _env(mlflow_server.uri, run_id, 1), is_main=True)
    tracked.end("completed", tmp_path / "model.safetensors")
    client, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert run.data.tags[MODEL_DIR_TAG] == str(tmp_path) and client.list_artifacts(run.info.run_id, "model") == []


def _priced(env: dict[str, str], usd_per_hour: float, spot: bool) -> dict[str, str]:
    return {**env, ENV_PRICE: json.dumps({"usd_per_hour": usd_per_hour, "spot": spot})}


def _ran(tracked: MlflowRun, hours: float) -> MlflowRun:
    """The attempt as if it had trained `hours` already (its clock's start moved back)."""
    tracked.began -= hours * 3600
    return tracked


def test_the_run_is_tagged_with_what_its_attempts_cost(mlflow_server):
    """Each attempt adds its cluster's price (as the launcher rendered it) times the hours it ran; a Spot attempt
    makes the figure an upper bound, and the basis says so. The cost and the instance-hours come from one clock:
    with 2 instances, each attempt's cost is its price times half the instance-hours it added (to the tags'
    rounding: 4 decimals of USD, 6 of hours)."""
    run_id = "gpt-costed-0123456789abcdef"
    first = _ran(MlflowRun.from_environment(CONFIG, _priced(_env(mlflow_server.uri, run_id, 1), 98.32, False),
                                            is_main=True), 1.0)
    first.end("stopped")
    _, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    hours_1, cost_1 = float(run.data.tags[INSTANCE_HOURS_TAG]), float(run.data.tags[COST_TAG])
    assert hours_1 >= 2.0 and abs(cost_1 - 98.32 * hours_1 / 2) < 1e-3
    assert run.data.tags[COST_BASIS_TAG] == ON_DEMAND

    second = _ran(MlflowRun.from_environment(CONFIG, _priced(_env(mlflow_server.uri, run_id, 2), 29.5, True),
                                             is_main=True), 0.5)
    second.end("completed")
    _, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    hours_2, cost_2 = float(run.data.tags[INSTANCE_HOURS_TAG]), float(run.data.tags[COST_TAG])
    assert abs(cost_2 - cost_1 - 29.5 * (hours_2 - hours_1) / 2) < 1e-3 and cost_2 >= cost_1 + 29.5 * 0.5
    assert run.data.tags[COST_BASIS_TAG] == SPOT

    # A third attempt back on demand: the run had a Spot attempt, so its figure stays an upper bound.
    third = MlflowRun.from_environment(CONFIG, _priced(_env(mlflow_server.uri, run_id, 3), 98.32, False),
                                       is_main=True)
    third.end("completed")
    _, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert run.data.tags[COST_BASIS_TAG] == SPOT and float(run.data.tags[COST_TAG]) >= cost_2


@pytest.mark.parametrize("price", [None, "not json", '{"usd_per_hour": "x", "spot": false}', '{"spot": true}',
                                   '{"usd_per_hour": -1, "spot": false}'])
def test_an_attempt_without_a_price_leaves_the_cost_unknown_from_then_on(mlflow_server, price):
    """No price rendered (the Price List API did not answer, a training plan, a local run), or one that is not a
    price: the run's cost tag is absent (unknown), and stays absent however later attempts are priced."""
    run_id = f"gpt-unpriced-{abs(hash(price)) % 10**16:016d}"
    env = _env(mlflow_server.uri, run_id, 1)
    first = _ran(MlflowRun.from_environment(CONFIG, env if price is None else {**env, ENV_PRICE: price},
                                            is_main=True), 1.0)
    first.end("stopped")
    _, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert COST_TAG not in run.data.tags and float(run.data.tags[INSTANCE_HOURS_TAG]) >= 2.0
    second = MlflowRun.from_environment(CONFIG, _priced(_env(mlflow_server.uri, run_id, 2), 98.32, False),
                                        is_main=True)
    second.end("completed")
    _, run, _ = logged_run(mlflow_server.uri, {RUN_ID_TAG: run_id})
    assert COST_TAG not in run.data.tags and COST_BASIS_TAG not in run.data.tags


def test_only_rank_0_and_only_with_a_server_named(mlflow_server):
    assert MlflowRun.from_environment(CONFIG, _env(mlflow_server.uri, "r", 1), is_main=False) is None
    assert MlflowRun.from_environment(CONFIG, {ENV_RUN_ID: "r"}, is_main=True) is None


def test_a_server_that_does_not_answer_is_one_line_and_the_run_trains_on(capsys, monkeypatch):
    # Nothing listens on the port. The client's retries are cut so the test is quick; the package's own defaults
    # (training.metrics.mlflow_run.HTTP_DEFAULTS) bound how long a job waits for a dead server at its start.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    uri = f"http://127.0.0.1:{free_port()}"
    assert MlflowRun.from_environment(CONFIG, _env(uri, "r", 1), is_main=True) is None
    # The package's bound where the job's environment sets none; a value it does set is kept.
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"[mlflow] the tracking server {uri} could not be reached")
    assert "trains on" in said[0]


def test_an_image_without_the_mlflow_client_says_so_once(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError, as in an image without it
    assert MlflowRun.from_environment(CONFIG, _env("http://127.0.0.1:1", "r", 1), is_main=True) is None
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "the mlflow package is not installed" in said[0] and "mlflow-skinny" in said[0]


def test_a_sagemaker_mlflow_arn_without_its_signing_plugin_says_which_package(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sagemaker_mlflow", None)  # not installed
    arn = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/shared"
    assert MlflowRun.from_environment(CONFIG, _env(arn, "r", 1), is_main=True) is None
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "SageMaker MLflow ARN" in said[0] and "pip install sagemaker-mlflow" in said[0]


@pytest.mark.parametrize("name", [ENV_MLFLOW_TRACKING_URI, ENV_MLFLOW_EXPERIMENT, "MLFLOW_TRACKING_TOKEN"])
def test_a_request_cannot_send_its_run_to_another_server_or_experiment(name):
    """The server and the experiment are the platform's (a team logs into its own experiment only)."""
    from jobs.request.environment_rules import check_environment, environment_problems

    # Not on the allow-list; and where a platform lets MLFLOW_* through, the platform's own two stay refused, saying
    # whose they are.
    assert [n for n, _ in environment_problems({name: "http://elsewhere:5000"}, [])] == [name]
    refused = dict(check_environment({name: "http://elsewhere:5000"}))
    if name == "MLFLOW_TRACKING_TOKEN":
        assert name in refused  # a credential by its name: `secrets` carry those
    else:
        assert "is set by the platform to the" in refused[name] and "MLflow" in refused[name]


@pytest.mark.parametrize("inherited", [True, False])
def test_a_local_run_passes_its_request_fields_wherever_it_logs_to_mlflow(monkeypatch, inherited):
    """`trainctl local` renders the request's fields as the launcher does, whether the server comes from --mlflow
    or from an inherited $MLFLOW_TRACKING_URI; with neither, no MLflow variable at all."""
    from cli.commands.local import mlflow_environment
    from contract.container import ENV_REQUEST
    from jobs.request.parse import parse_request

    request = parse_request({"name": "local-tracked", "dataset": "./corpus/train", "instance": {"type": "ml.c5.2xlarge"}})
    if inherited:
        monkeypatch.setenv(ENV_MLFLOW_TRACKING_URI, "http://127.0.0.1:5000")
    else:
        monkeypatch.delenv(ENV_MLFLOW_TRACKING_URI, raising=False)
    assert json.loads(mlflow_environment("http://127.0.0.1:5000", request)[ENV_REQUEST])["dataset"] == "./corpus/train"
    assert mlflow_environment(None, request) == (
        {ENV_REQUEST: mlflow_environment("http://127.0.0.1:5000", request)[ENV_REQUEST]} if inherited else {})


@pytest.mark.parametrize(("tags", "hours_before", "usd"), [
    ({}, 0.0, 0.0),  # a first attempt, or one found before any attempt ended
    ({}, 2.0, None),  # earlier attempts ran without a price: unknown from then on
    ({"trainctl.cost_usd": "12.5"}, 2.0, 12.5),
    ({"trainctl.cost_usd": "twelve"}, 2.0, None),  # edited by hand: unknown, never a crash at the start
])
def test_what_earlier_attempts_cost_is_read_from_the_run_tags(tags, hours_before, usd):
    from training.metrics.mlflow_run import Cost

    assert COST_TAG == "trainctl.cost_usd"
    assert Cost.logged(tags, hours_before).usd == usd

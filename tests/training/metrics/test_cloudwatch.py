"""training.metrics.cloudwatch: a job's metrics in its team's own namespace, sent beside training, never in its way.

CloudWatch is moto's (its PutMetricData and ListMetrics/GetMetricStatistics as the service answers them); a run of the
real loop sends through it in this process. What cannot run here: a GPU's NVML reading (send_gpus sends nothing on a
CPU, which is checked), and the real endpoint.
"""

from __future__ import annotations

import ast
import math
import threading
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from contract.container import ENV_CURRENT_HOST, ENV_METRICS_NAMESPACE, ENV_RUN_ID
from contract.metrics import CHECKPOINT_OVERDUE, HOST_DIMENSION, RUN_DIMENSION, STEP, TRAIN_LOSS, VAL_LOSS
from tests.training.helpers import config
from training.metrics.cloudwatch import QUEUE_BATCHES, CloudWatchMetrics, gpu_utilization

NAMESPACE = "TrainingPlatform/mltrain--a"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def cloudwatch(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def sent(client, namespace: str = NAMESPACE) -> dict[str, list[dict]]:
    """Each metric name in `namespace` with its dimensions."""
    found: dict[str, list[dict]] = {}
    for m in client.list_metrics(Namespace=namespace)["Metrics"]:
        found.setdefault(m["MetricName"], []).append({d["Name"]: d["Value"] for d in m["Dimensions"]})
    return found


def test_a_line_reaches_the_namespace_by_run_and_non_finite_values_stay_out(cloudwatch):
    cloud = CloudWatchMetrics(NAMESPACE, "run-abc", "algo-1", client=cloudwatch)
    cloud.send_values({STEP: 10, TRAIN_LOSS: 2.5, VAL_LOSS: math.nan, CHECKPOINT_OVERDUE: 0.25})
    cloud.close()
    found = sent(cloudwatch)
    assert set(found) == {STEP, TRAIN_LOSS, CHECKPOINT_OVERDUE}  # CloudWatch refuses NaN: left out, not failed
    assert all(dims == [{RUN_DIMENSION: "run-abc"}] for dims in found.values())
    assert sent(cloudwatch, "/aws/sagemaker/TrainingJobs") == {}


def test_only_the_ranks_that_send_get_a_sender_and_only_where_the_launcher_names_a_namespace(cloudwatch):
    env = {ENV_METRICS_NAMESPACE: NAMESPACE, ENV_CURRENT_HOST: "algo-2"}
    assert CloudWatchMetrics.from_environment({}, "run-abc", is_main=True, local_rank=0) is None  # a local run
    assert CloudWatchMetrics.from_environment(env, "run-abc", is_main=False, local_rank=3) is None
    for is_main, local_rank in ((True, 0), (False, 0)):
        cloud = CloudWatchMetrics.from_environment(env, "run-abc", is_main=is_main, local_rank=local_rank)
        assert (cloud.namespace, cloud.run_id, cloud.host) == (NAMESPACE, "run-abc", "algo-2")
        cloud.close()


def test_a_host_without_a_gpu_sends_no_gpu_metric(cloudwatch):
    assert gpu_utilization() == {}
    cloud = CloudWatchMetrics(NAMESPACE, "run-abc", "algo-1", client=cloudwatch)
    cloud.send_gpus()
    cloud.close()
    assert sent(cloudwatch) == {}


def test_gpu_metrics_carry_the_run_and_the_host(cloudwatch, monkeypatch):
    import training.metrics.cloudwatch as module

    monkeypatch.setattr(module, "gpu_utilization", lambda: {"gpu_utilization": 37.5})
    cloud = CloudWatchMetrics(NAMESPACE, "run-abc", "algo-3", client=cloudwatch)
    cloud.send_gpus()
    cloud.close()
    assert sent(cloudwatch) == {"gpu_utilization": [{RUN_DIMENSION: "run-abc", HOST_DIMENSION: "algo-3"}]}


class Refusing:
    """A client whose every call fails as CloudWatch without a route does (a job with network isolation)."""

    def __init__(self) -> None:
        self.calls = 0

    def put_metric_data(self, **_):
        self.calls += 1
        raise ConnectionError("Could not connect to the endpoint URL: https://monitoring.us-east-1.amazonaws.com/")


def test_a_failure_is_said_once_and_never_raised(capsys):
    client = Refusing()
    cloud = CloudWatchMetrics(NAMESPACE, "run-abc", "algo-1", client=client)
    for step in range(5):
        cloud.send_values({STEP: step})
    cloud.close()
    out = capsys.readouterr().out
    assert client.calls == 5 and out.count("could not send metrics to CloudWatch") == 1
    assert NAMESPACE in out and "training goes on" in out


class Slow:
    """A client held until released: CloudWatch slower than the log interval."""

    def __init__(self) -> None:
        self.release, self.batches = threading.Event(), []

    def put_metric_data(self, MetricData, **_):
        self.release.wait()
        self.batches.append(MetricData)


def test_a_slow_endpoint_never_holds_training_and_the_newest_values_are_sent():
    client = Slow()
    cloud = CloudWatchMetrics(NAMESPACE, "run-abc", "algo-1", client=client)
    for step in range(10 * QUEUE_BATCHES):  # returns at once though nothing can be sent yet
        cloud.send_values({STEP: step})
    client.release.set()
    cloud.close()
    steps = [batch[0]["Value"] for batch in client.batches]
    # The first batch was taken before the endpoint stalled; the queue kept the newest, dropping the oldest.
    assert len(steps) <= QUEUE_BATCHES + 1 and steps[-1] == 10 * QUEUE_BATCHES - 1


def test_a_run_sends_its_lines_and_checkpoint_age_to_the_team_namespace(cloudwatch, tmp_path, corpus, monkeypatch):
    from training.loop import train
    from training.parallel.process_group import setup
    from training.resilience.stop import StopFlag

    monkeypatch.setenv(ENV_METRICS_NAMESPACE, NAMESPACE)
    monkeypatch.setenv(ENV_RUN_ID, "team-run-abcdefghijklmnop")
    cfg = config(tmp_path, corpus, max_steps=4, checkpoint_interval=2)
    train(cfg, setup(cfg), StopFlag())
    found = sent(cloudwatch)
    assert {STEP, TRAIN_LOSS, CHECKPOINT_OVERDUE} <= set(found)
    assert found[CHECKPOINT_OVERDUE] == [{RUN_DIMENSION: "team-run-abcdefghijklmnop"}]
    stats = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE, MetricName=STEP, Dimensions=[{"Name": RUN_DIMENSION, "Value": "team-run-abcdefghijklmnop"}],
        StartTime="2000-01-01T00:00:00Z", EndTime="2100-01-01T00:00:00Z", Period=86400, Statistics=["Maximum"])
    assert max(p["Maximum"] for p in stats["Datapoints"]) == 4


def test_boto3_is_imported_by_the_sender_alone():
    # The training package runs anywhere: only the sender imports boto3, and only when a namespace is named.
    importers = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        names = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import | ast.ImportFrom)
                 for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
        if "boto3" in names:
            importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["training/metrics/cloudwatch.py"]

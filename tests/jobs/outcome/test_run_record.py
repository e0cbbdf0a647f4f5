"""The run record's arithmetic on hand-made attempts (jobs.outcome.run_record), and the launcher's price source
(jobs.handler.training_prices: the AWS Price List API, read by jobs.prices as trainctl reads it).

The state-machine test of a run of several attempts is tests/launcher/test_run_record.py.
"""

from __future__ import annotations

import dataclasses
import json
import socket

import boto3
import pytest
from botocore.stub import Stubber

from contract.container import ENV_MLFLOW_TRACKING_URI, ENV_PRICE
from jobs import handler
from jobs.outcome.run_record import (
    attempt_time,
    cluster_types,
    measured_save_seconds,
    run_cost,
    run_record,
)
from jobs.prices import instance_filters
from jobs.retry.run_state import Attempt, job_figures
from tests.cli.test_plan_prices import product


def attempt(n: int = 1, **fields) -> Attempt:
    base = {"attempt": n, "job_name": f"job-a{n}", "instance_type": "ml.p5.48xlarge", "instance_count": 2,
            "spot": False, "training_seconds": 1000, "billable_seconds": 1000}
    return Attempt(**(base | fields))


def test_job_figures_read_the_description_and_the_final_metrics():
    job = {"CreationTime": "2027-01-01T00:00:00Z", "TrainingStartTime": "2027-01-01T00:05:00Z",
           "TrainingEndTime": "2027-01-01T01:05:00Z",
           "SecondaryStatusTransitions": [{"Status": "Starting", "StartTime": "2027-01-01T00:00:00Z"},
                                          {"Status": "Downloading", "StartTime": "2027-01-01T00:05:00Z"},
                                          {"Status": "Training", "StartTime": "2027-01-01T00:06:30Z"}],
           "FinalMetricDataList": [{"MetricName": n, "Value": v} for n, v in
                                   {"startup_s": 40.4, "train_s": 3000.6, "checkpoint_s": 99.5, "eval_s": 0.2,
                                    "checkpoint_age_s": 75.0, "step": 5000.0, "checkpoint_saves": 4.0}.items()]}
    assert job_figures(job) == {"queued_seconds": 300, "startup_seconds": 90 + 40, "train_seconds": 3001,
                                "checkpoint_seconds": 100, "eval_seconds": 0, "checkpoint_age_seconds": 75,
                                "step": 5000, "checkpoint_saves": 4}


def test_a_job_that_never_started_queued_its_whole_life_and_measured_nothing():
    job = {"CreationTime": 1_800_000_000, "LastModifiedTime": 1_800_000_120, "TrainingJobStatus": "Failed"}
    figures = job_figures(job)
    assert figures["queued_seconds"] == 120
    assert all(figures[k] is None for k in ("startup_seconds", "train_seconds", "step"))


@pytest.mark.parametrize("fields, expected", [
    # held 1000: startup 50, train 900 of which 100 redone, checkpoint 20, eval 10 -> other 20
    ({"startup_seconds": 50, "train_seconds": 900, "checkpoint_seconds": 20, "eval_seconds": 10,
      "lost_seconds": 100}, (50, 800, 20, 10, 100, 20)),
    # the parts measured add up to more than held (clocks): scaled down to fit, nothing left over
    ({"startup_seconds": 200, "train_seconds": 900, "checkpoint_seconds": 100, "eval_seconds": 0,
      "lost_seconds": 0}, (166, 750, 83, 0, 0, 1)),
    # no metrics: nothing productive; an interruption's upper bound is all redone
    ({"lost_seconds": 1000, "lost_is_upper_bound": True}, (0, 0, 0, 0, 1000, 0)),
    # lost more than trained: only what was trained can be redone
    ({"train_seconds": 300, "lost_seconds": 500}, (0, 0, 0, 0, 300, 700)),
])
def test_held_time_splits_into_buckets_that_add_up(fields, expected):
    split = attempt_time(attempt(**fields))
    assert (split.startup, split.productive, split.checkpoint, split.eval, split.redone, split.other) == expected
    assert sum(expected) == split.held == 1000


def test_goodput_weights_attempts_by_their_instances():
    small = attempt(1, instance_count=1, train_seconds=1000)  # all productive, one instance
    big = attempt(2, instance_count=3, train_seconds=500)  # half productive, three instances
    record = run_record([small, big], started=0, ended=5000)
    assert record["held_instance_seconds"] == 1000 + 3000
    assert record["goodput"] == pytest.approx((1000 + 1500) / 4000)
    assert record["wall_seconds"] == 5000


def test_waits_between_attempts_are_wall_time_not_held_time():
    first = attempt(1, started_at="2027-01-01T00:00:00Z", ended_at="2027-01-01T01:00:00Z")
    second = attempt(2, started_at="2027-01-01T01:10:00Z", ended_at="2027-01-01T02:00:00Z")
    record = run_record([first, second], started=0, ended=1)
    assert record["between_attempts_seconds"] == 600
    assert record["held_instance_seconds"] == 2 * 1000 * 2


def test_cost_is_billable_seconds_at_the_on_demand_rate_spot_and_on_demand_apart():
    prices = {"ml.p5.48xlarge": 36.0, "ml.p4d.24xlarge": 18.0}
    on_demand = attempt(1, training_seconds=3600, billable_seconds=3600)
    spot = attempt(2, instance_type="ml.p4d.24xlarge", spot=True, training_seconds=3600, billable_seconds=1200)
    cost = run_cost([on_demand, spot], prices)
    assert cost == {"on_demand_usd": 72.0, "spot_usd": 12.0, "spot_savings_usd": 24.0, "total_usd": 84.0,
                    "unpriced": []}


def test_a_type_without_a_price_leaves_its_side_unknown_and_names_it():
    cost = run_cost([attempt(1), attempt(2, instance_type="ml.p4d.24xlarge", spot=True)],
                    {"ml.p5.48xlarge": 36.0})
    assert cost["on_demand_usd"] == 20.0 and cost["spot_usd"] is None and cost["spot_savings_usd"] is None
    assert cost["total_usd"] is None and cost["unpriced"] == ["ml.p4d.24xlarge"]


def test_an_attempt_that_held_nothing_costs_nothing_even_without_a_price():
    cost = run_cost([attempt(1, training_seconds=0, billable_seconds=0, instance_type="ml.unknown")], {})
    assert cost["total_usd"] == 0.0 and cost["unpriced"] == []


def test_instance_groups_are_priced_group_by_group():
    groups = "2xml.p4d.24xlarge,1xml.c5.4xlarge"
    assert cluster_types(groups, 3) == [(2, "ml.p4d.24xlarge"), (1, "ml.c5.4xlarge")]
    cost = run_cost([attempt(1, instance_type=groups, instance_count=3, training_seconds=3600,
                             billable_seconds=3600)], {"ml.p4d.24xlarge": 30.0, "ml.c5.4xlarge": 1.0})
    assert cost["on_demand_usd"] == 61.0


@pytest.fixture
def pricing(monkeypatch):
    """The Lambda's pricing client, answered by a Stubber (moto has no Price List API); no network."""
    monkeypatch.setattr(socket.socket, "connect", lambda *a: (_ for _ in ()).throw(AssertionError("network")))
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    monkeypatch.setattr(boto3, "client", lambda *a, **k: client)
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def _asked(instance_type: str) -> dict:
    return {"ServiceCode": "AmazonSageMaker", "FormatVersion": "aws_v1",
            "Filters": instance_filters("us-east-1", instance_type)}


def test_the_launcher_prices_the_types_its_run_used(pricing):
    pricing.add_response("get_products", {"PriceList": [product("ml.p4d.24xlarge", "37.6885")]},
                         _asked("ml.p4d.24xlarge"))
    pricing.add_response("get_products", {"PriceList": [product("ml.p5.48xlarge", "113.0710")]},
                         _asked("ml.p5.48xlarge"))
    assert handler.training_prices("us-east-1", ["ml.p4d.24xlarge", "ml.p5.48xlarge"]) == {
        "ml.p4d.24xlarge": 37.6885, "ml.p5.48xlarge": 113.071}


@pytest.mark.parametrize("code", ["AccessDeniedException", "ThrottlingException", "InternalErrorException"])
def test_a_refused_price_list_leaves_the_cost_unknown_and_ends_the_run_all_the_same(pricing, code):
    pricing.add_client_error("get_products", service_error_code=code, http_status_code=400)
    assert handler.training_prices("us-east-1", ["ml.p4d.24xlarge"]) == {}


@pytest.mark.parametrize("mlflow", [True, False])
def test_a_launch_prices_its_attempt_only_where_its_mlflow_run_tags_the_cost(pricing, monkeypatch, platform, mlflow):
    """Prepare asks the Price List API for the attempt's type once, and renders its price (contract.container.
    ENV_PRICE); on a platform without an MLflow server it asks nothing (the stub fails on any call it did not
    expect) and renders none."""
    settings = dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com" if mlflow else None)
    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps(settings.to_dict()))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    if mlflow:
        pricing.add_response("get_products", {"PriceList": [product("ml.p4d.24xlarge", "37.6885")]},
                             _asked("ml.p4d.24xlarge"))
    request = {"name": "priced", "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/",
               "spot": True, "instance": {"type": "ml.p4d.24xlarge", "count": 2}}
    environment = handler.prepare({"request": request, "execution": {}, "state_shape": handler.STATE_SHAPE})[
        "launch"]["create"]["Environment"]
    price = {"usd_per_hour": 2 * 37.6885, "spot": True}
    assert (json.loads(environment[ENV_PRICE]) if ENV_PRICE in environment else None) == (price if mlflow else None)


def test_a_price_list_that_does_not_answer_launches_the_attempt_unpriced(pricing, monkeypatch, platform):
    settings = dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com")
    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps(settings.to_dict()))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    pricing.add_client_error("get_products", service_error_code="ThrottlingException", http_status_code=400)
    request = {"name": "unpriced", "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/",
               "instance": {"type": "ml.p4d.24xlarge"}}
    create = handler.prepare({"request": request, "execution": {}, "state_shape": handler.STATE_SHAPE})[
        "launch"]["create"]
    assert ENV_PRICE not in create["Environment"] and ENV_MLFLOW_TRACKING_URI in create["Environment"]


def test_the_save_time_measured_is_the_newest_attempts_mean_stall():
    assert measured_save_seconds([attempt(1), attempt(2)]) is None
    older = attempt(1, checkpoint_seconds=100, checkpoint_saves=4)
    newer = attempt(2, checkpoint_seconds=90, checkpoint_saves=3)
    assert measured_save_seconds([older, newer]) == 30.0
    assert measured_save_seconds([older, newer, attempt(3)]) == 30.0  # a later attempt that never saved

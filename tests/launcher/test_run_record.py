"""The run's record (goodput, its losses, cost) through the real state machine: a run of several attempts
whose jobs report the training package's time metrics, checked against the arithmetic done by hand.

The emulated jobs move one secondary status per minute from their creation (sagemaker_sync._play):
Starting at +0, Downloading at +60 s (TrainingStartTime: billing starts), Training at +120 s. So each job
that reaches Training queued 60 s and downloaded 60 s before its container started.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from jobs.outcome.run_record import run_cost
from jobs.planning.auto_strategy import attempt_cadence
from jobs.request.parse import parse_request
from jobs.retry.run_state import Attempt
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request

QUEUED = DOWNLOAD = 60

INTERRUPTED = {"step": 1400, "startup_s": 100, "train_s": 1500, "checkpoint_s": 60, "checkpoint_saves": 2,
               "eval_s": 30, "checkpoint_age_s": 240, "train_loss": 2.9}
FINISHED = {"step": 3000, "startup_s": 200, "train_s": 3000, "checkpoint_s": 100, "eval_s": 50,
            "checkpoint_age_s": 10, "train_loss": 2.1}


REQUEST = job_request(spot=True, retry={"interruptions_before_on_demand": 1})


@pytest.fixture(scope="module")
def three_attempts(harness):
    """Spot, interrupted (held 1800 s, billed 600 s); a capacity shortage (no instances); on demand, done."""
    request = REQUEST
    outcomes = [dataclasses.replace(sm.spot_interrupted(), metrics=INTERRUPTED, billable_seconds=600),
                sm.capacity_error(),
                dataclasses.replace(sm.completed(), metrics=FINISHED, training_seconds=3600)]
    result = harness.run(request, outcomes, name="record-three-attempts")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    return result


def test_each_attempt_records_where_its_time_went(three_attempts):
    first, shortage, last = three_attempts.output["attempts"]
    assert (first["spot"], shortage["spot"], last["spot"]) == (True, False, False)
    assert first["startup_seconds"] == 100 + DOWNLOAD and last["startup_seconds"] == 200 + DOWNLOAD
    assert (first["train_seconds"], first["checkpoint_seconds"], first["eval_seconds"]) == (1500, 60, 30)
    assert first["lost_seconds"] == 240 and not first["lost_is_upper_bound"]  # the checkpoint's age, not 1800
    assert last["lost_seconds"] == 0 and (first["step"], last["step"]) == (1400, 3000)
    assert first["queued_seconds"] == last["queued_seconds"] == QUEUED
    assert shortage["training_seconds"] == 0 and shortage["train_seconds"] is None


def test_goodput_and_losses_add_up(three_attempts):
    record = three_attempts.output["record"]
    count = three_attempts.create_calls[0]["ResourceConfig"]["InstanceCount"]
    assert all(c["ResourceConfig"]["InstanceCount"] == count for c in three_attempts.create_calls)
    # held: 1800 + 3600 per instance. Attempt 1: startup 160, productive 1500 - 240 = 1260, checkpoint 60,
    # eval 30, redone 240, other 1800 - 1750 = 50. Attempt 3: startup 260, productive 3000, checkpoint 100,
    # eval 50, other 3600 - 3410 = 190.
    expected = {"startup": 160 + 260, "productive": 1260 + 3000, "checkpoint": 60 + 100, "eval": 30 + 50,
                "redone": 240, "other": 50 + 190}
    assert record["instance_seconds"] == {k: v * count for k, v in expected.items()}
    assert record["held_instance_seconds"] == (1800 + 3600) * count == sum(record["instance_seconds"].values())
    assert record["goodput"] == pytest.approx(4260 / 5400, abs=1e-4)
    assert record["step"] == 3000 and record["unmeasured_attempts"] == []
    assert record["queued_seconds"] == QUEUED * 2 + 60  # the shortage's job waited a minute and failed
    # The launcher has no price source: cost unknown, and said so, never a made-up figure.
    assert record["cost"]["total_usd"] is None and record["cost"]["unpriced"] == ["ml.p4d.24xlarge",
                                                                                   "ml.p5.48xlarge"]


def test_the_notification_carries_the_record(three_attempts):
    ((_, message),) = three_attempts.notifications
    assert "Goodput 79% of" in message and "redone 4%" in message and "productive 79%" in message
    assert "step 3000" in message and "Cost unknown" in message


def test_cost_from_the_record_is_billable_time_at_the_on_demand_rate(three_attempts):
    """The same attempts priced: Spot's discount is in its billable seconds (600 of 1800 held)."""
    attempts = [Attempt(**a) for a in three_attempts.output["attempts"]]
    count = attempts[0].instance_count
    prices = {"ml.p4d.24xlarge": 36.0, "ml.p5.48xlarge": 72.0}
    cost = run_cost(attempts, prices)
    rate_first = prices[attempts[0].instance_type] * count / 3600
    rate_last = prices[attempts[2].instance_type] * count / 3600
    assert cost["spot_usd"] == pytest.approx(600 * rate_first, abs=0.01)
    assert cost["spot_savings_usd"] == pytest.approx(1200 * rate_first, abs=0.01)
    assert cost["on_demand_usd"] == pytest.approx(3600 * rate_last, abs=0.01)
    assert cost["total_usd"] == pytest.approx(cost["spot_usd"] + cost["on_demand_usd"], abs=0.01)
    assert cost["unpriced"] == []


def test_a_job_without_the_time_metrics_counts_its_whole_time_as_lost(harness):
    """An image that does not print the metrics: its interruption loses its whole training time (said to be
    an upper bound), and goodput counts none of its time as productive."""
    result = harness.run(job_request(spot=True), [sm.spot_interrupted(), sm.completed()], name="record-unmeasured")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    first = result.output["attempts"][0]
    assert first["lost_seconds"] == 1800 and first["lost_is_upper_bound"]
    record = result.output["record"]
    assert record["unmeasured_attempts"] == [1, 2] and record["goodput"] == 0
    assert "at least" in result.notifications[0][1]


def test_the_next_attempts_cadence_plans_with_the_save_time_measured(three_attempts):
    """Attempt 1 stalled 60 s over 2 saves: attempt 3 (attempt 2 never ran) plans its checkpoint_minutes with
    30 s a save, not the planner's model of one."""
    request = parse_request(REQUEST)
    first, _, last = (c["HyperParameters"] for c in three_attempts.create_calls)
    kind = three_attempts.create_calls[2]["ResourceConfig"]["InstanceType"]
    modelled, measured = attempt_cadence(request, kind, False), attempt_cadence(request, kind, False, 30.0)
    assert json.loads(last["checkpoint_minutes"]) == round(measured.interval_min, 1)
    assert round(measured.interval_min, 1) != round(modelled.interval_min, 1)
    assert json.loads(first["checkpoint_minutes"]) == round(
        attempt_cadence(request, three_attempts.create_calls[0]["ResourceConfig"]["InstanceType"], True).interval_min, 1)


@pytest.mark.parametrize(("share", "given", "bound"), [(0.3, None, True), (0.05, None, False), (0.3, 0.5, False)])
def test_an_input_bound_run_is_named_in_its_summary(harness, share, given, bound):
    """The training package's mean wait for data over the attempt (its last metrics line) against the job's
    input_bound_share (the request's, else the package's default): over it, the summary and the notification say
    the run was input bound, with the figures and the fixes."""
    hyperparameters = {"input_bound_share": given} if given is not None else {}
    request = job_request(hyperparameters={"lr": 0.0003, **hyperparameters})
    result = harness.run(request, [sm.completed(train_loss=2.0, data_wait_share=share, data_wait_ms=41.5)],
                         name=f"input-bound-{share}-{given}")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    ((_, message),) = result.notifications
    if bound:
        assert result.output["input_bound"] == {"data_wait_share": share, "data_wait_ms": 41.5,
                                                "input_bound_share": 0.1}
        assert "Input bound: the steps waited 30% of their time for data (41.5 ms a step" in message
    else:
        assert result.output["input_bound"] is None and "Input bound" not in message


def test_the_record_keeps_what_the_run_measured_against_the_planner(harness):
    """A run that fell back to p5 after a capacity shortage: its record's `measured` section is the last job's
    (instance type, count, strategy and degrees as sent, its step time and MFU) beside the planner's figure for that
    very layout, sized here independently from the request."""
    from contract.metrics import MFU, STEP_TIME_MS
    from jobs.catalog import lookup
    from jobs.planning.layout import Layout, numerics
    from jobs.planning.shape import model_facts
    from jobs.planning.timing import step_time

    request = job_request(hyperparameters={"lr": 0.0003, "global_batch_size": 256, "micro_batch_size": 4})
    result = harness.run(request, [sm.capacity_error(), sm.completed(**{STEP_TIME_MS: 812.5, MFU: 0.38})],
                         name="record-measured")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    measured = result.output["record"]["measured"]
    last = result.create_calls[-1]
    count = last["ResourceConfig"]["InstanceCount"]
    assert (measured["instance_type"], measured["instance_count"]) == ("ml.p5.48xlarge", count)
    assert (measured["strategy"], measured["model"], measured["model_size"]) == ("fsdp", "gpt", "125m")
    assert measured["job_name"] == last["TrainingJobName"] and measured["run_id"] == result.output["run_id"]
    assert measured["degrees"] == {"replicate": 1, "shard": 8 * count, "tensor": 1, "pipeline": 1}
    assert (measured["step_time_s"], measured["mfu"], measured["micro_batch_size"]) == (0.8125, 0.38, 4)
    n = numerics(request["hyperparameters"])
    predicted = step_time(model_facts("gpt", "125m", None, n.seq_len), n, lookup("ml.p5.48xlarge"),
                          Layout(count, 8, shard=8 * count)).total
    assert measured["predicted_step_time_s"] == pytest.approx(predicted, rel=1e-5)
    assert measured["measured_over_predicted"] == pytest.approx(0.8125 / predicted, abs=1e-4)


def test_a_run_whose_job_measured_no_step_time_has_no_measured_section(three_attempts):
    assert three_attempts.output["record"]["measured"] is None

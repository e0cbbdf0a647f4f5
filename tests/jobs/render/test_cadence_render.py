"""The planner's checkpoint cadence reaches the job: jobs.render.training_job sets `checkpoint_minutes` from jobs.planning.auto_strategy's
Young/Daly interval for the attempt, fits it before a training plan's end, and leaves an ended plan alone."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from jobs.naming import new_run_id
from jobs.planning import plan_request
from jobs.planning.auto_strategy import attempt_cadence
from jobs.planning.cadence import PLAN_RECLAIM_HOURS, RESTART_HOURS, before_plan_end
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request, validate_for_platform
from tests.jobs.conftest import assert_valid_create_request

BASE = {"name": "gpt-1b", "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/",
        "model": "gpt", "model_size": "1b", "instance": {"type": "ml.p4d.24xlarge", "count": 2}}
START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC).timestamp()


def render(doc, platform, **kw):
    req = parse_request({**BASE, **doc})
    validate_for_platform(req, platform)
    create = render_create_training_job(req, platform, run_id=new_run_id(req.name), attempt=1, starts_at=START, **kw)
    assert_valid_create_request(create)
    return req, create


def minutes(create):
    raw = create["HyperParameters"].get("checkpoint_minutes")
    return None if raw is None else json.loads(raw)


def test_spot_request_renders_the_planners_cadence(platform):
    req, create = render({"spot": True}, platform)
    planned = attempt_cadence(req, "ml.p4d.24xlarge", True)
    assert minutes(create) == round(planned.interval_min, 1)
    # `trainctl plan` shows the same number: one computation for both.
    assert plan_request(req).recommendation.to_dict()["checkpoint_minutes"] == minutes(create)


def test_cadence_follows_spot_and_node_count(platform):
    _, spot = render({"spot": True}, platform)
    _, on_demand = render({"spot": True}, platform, spot=False)  # the policy's move off Spot
    _, one_node = render({"spot": True, "instance": {"type": "ml.p4d.24xlarge", "count": 1}}, platform)
    # Spot interrupts more often: save more often. One node saves half the state at half the bandwidth, twice as
    # long, and is interrupted half as often: sqrt(2 x 2) = twice the interval.
    assert minutes(spot) < minutes(on_demand)
    assert minutes(one_node) == pytest.approx(2 * minutes(spot), abs=0.1)


def test_the_cadence_is_the_same_on_another_type_of_the_same_count(platform):
    # The model's save bandwidth and interruption rates are per node, not per type (one H100 measurement).
    req, fallback = render({"spot": True, "instance": {"type": "ml.p4d.24xlarge", "count": 2,
                                                       "fallbacks": ["ml.p5.48xlarge"]}}, platform,
                           instance_type="ml.p5.48xlarge")
    assert minutes(fallback) == round(attempt_cadence(req, "ml.p5.48xlarge", True).interval_min, 1)


@pytest.mark.parametrize("given", [{"checkpoint_minutes": 30}, {"checkpoint_minutes": 0}, {"checkpoint-minutes": 7}])
def test_a_request_that_sets_checkpoint_minutes_keeps_it(platform, given):
    _, create = render({"spot": True, "hyperparameters": given}, platform)
    (key, value), = given.items()
    assert json.loads(create["HyperParameters"][key]) == value
    assert [k for k in create["HyperParameters"] if "minutes" in k] == [key]


def test_no_cadence_where_the_planner_sizes_nothing(platform):
    _, cpu = render({"instance": {"type": "ml.c5.4xlarge"}}, platform)
    assert minutes(cpu) is None


def plan_platform(platform, end):
    plan = dataclasses.replace(platform.training_plans["p5-reserved"], end_time=end.isoformat().replace("+00:00", "Z"))
    return dataclasses.replace(platform, training_plans={"p5-reserved": plan})


ON_PLAN = {"training_plan": "p5-reserved", "instance": {"type": "ml.p5.48xlarge", "count": 2}}


@pytest.mark.parametrize("hours_left", [10, 1])
def test_a_training_plan_attempt_saves_before_the_plan_ends(platform, hours_left):
    end = dt.datetime.fromtimestamp(START, dt.UTC) + dt.timedelta(hours=hours_left)
    req, create = render(ON_PLAN, plan_platform(platform, end))
    assert create["ResourceConfig"]["TrainingPlanArn"] == platform.training_plans["p5-reserved"].arn
    cad = attempt_cadence(req, "ml.p5.48xlarge", False)
    capped = minutes(create)
    assert capped < cad.interval_min
    reclaim = end.timestamp() - PLAN_RECLAIM_HOURS * 3600
    assert capped == round(before_plan_end(cad.interval_min, cad.save_s, START, reclaim), 1)
    # Saves every `capped` minutes from the first step: the last whole one ends before the reclaim.
    first_step = START + RESTART_HOURS * 3600
    saves = int((reclaim - first_step) / 60 // capped)
    last_end = first_step + saves * capped * 60 + cad.save_s
    assert last_end <= reclaim
    assert reclaim - last_end < capped * 60 / 10 + 2 * cad.save_s  # lands near the end, not a whole interval early


def test_an_attempt_after_the_plan_ended_runs_on_demand(platform):
    ended = dt.datetime.fromtimestamp(START, dt.UTC) + dt.timedelta(hours=PLAN_RECLAIM_HOURS / 2)  # reclaimed
    req, create = render(ON_PLAN, plan_platform(platform, ended))
    assert "TrainingPlanArn" not in create["ResourceConfig"]
    assert create["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"
    assert create["EnableManagedSpotTraining"] is False
    assert minutes(create) == round(attempt_cadence(req, "ml.p5.48xlarge", False).interval_min, 1)  # not capped


def test_a_plan_without_end_time_is_targeted_uncapped(platform):
    req, create = render(ON_PLAN, platform)
    assert create["ResourceConfig"]["TrainingPlanArn"] == platform.training_plans["p5-reserved"].arn
    assert minutes(create) == round(attempt_cadence(req, "ml.p5.48xlarge", False).interval_min, 1)

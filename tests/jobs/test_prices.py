"""Prices: the planner takes them as an input (instance type -> USD per hour) and says "price unknown" rather than
invent one. Every price here is synthetic; where real ones come from is cli/price_source.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from jobs import catalog
from jobs.planning import PlanInputError, plan_request
from jobs.planning.warnings import cheapest
from jobs.request.parse import parse_request


def sized(instance_type: str, prices=None, count: int = 1, **sizing):
    return plan_request(parse_request({"name": "prices", "dataset": "s3://bucket/data/", "model": "gpt",
                                       "model_size": "125m", "instance": {"type": instance_type, "count": count},
                                       "sizing": {"dataset_tokens": 10**10, **sizing}}), prices=prices)


def test_spot_assumptions_stay_plausible():
    # Labelled assumptions in jobs/catalog.py: AWS bounds the saving at 90%; a rate is a fraction per month.
    assert 0 < catalog.SPOT_SAVINGS <= 0.9 and 0 < catalog.SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH < 1


@pytest.mark.parametrize("budget", [None, 50.0])
@pytest.mark.parametrize("prices", [None, {}, {"ml.p4d.24xlarge": 10.0}])
def test_an_unpriced_type_warns_price_unknown_and_has_no_cost(budget, prices):
    result = sized("ml.p5en.48xlarge", prices, **({"budget_usd": budget} if budget else {}))
    rec = result.recommendation
    assert rec.cost_usd is None and rec.cost_on_demand_usd is None
    [warning] = [w for w in result.warnings if w.code == "price_unknown"]
    assert "ml.p5en.48xlarge" in warning.message and "--prices aws" in warning.message
    assert ("cannot check sizing.budget_usd=50" in warning.message) == (budget is not None)
    assert "over_budget" not in {w.code for w in result.warnings}


@pytest.mark.parametrize("count", [1, 2])
def test_a_priced_type_is_costed_and_checked_against_the_budget(count):
    result = sized("ml.p4d.24xlarge", {"ml.p4d.24xlarge": 10.0}, count=count, budget_usd=1)
    rec = result.recommendation
    assert rec.layout.nodes == count
    assert rec.cost_usd == rec.cost_on_demand_usd == pytest.approx(rec.hours * count * 10.0)
    codes = {w.code for w in result.warnings}
    assert "over_budget" in codes and "price_unknown" not in codes


def test_each_type_gets_its_own_price_and_a_missing_one_stays_unknown():
    result = sized("ml.p4d.24xlarge", {"ml.p4d.24xlarge": 10.0, "ml.p5.48xlarge": 30.0})
    by_type = {}
    for c in result.candidates:
        by_type.setdefault(c.instance_type, []).append(c)
        price = {"ml.p4d.24xlarge": 10.0, "ml.p5.48xlarge": 30.0}.get(c.instance_type)
        assert c.cost_usd == (None if price is None else pytest.approx(c.hours * c.layout.nodes * price))
    assert {"ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g5.48xlarge"} <= set(by_type)


def test_without_a_table_no_type_is_priced():
    result = sized("ml.p4d.24xlarge")
    assert all(c.cost_usd is None for c in result.candidates)
    assert "price_unknown" in {w.code for w in result.warnings}


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "10"])
def test_an_unusable_price_is_refused_naming_the_type(bad):
    with pytest.raises(PlanInputError, match=r"prices\['ml.p4d.24xlarge'\]"):
        sized("ml.p4d.24xlarge", {"ml.p4d.24xlarge": bad})


def test_cheapest_never_weighs_dollars_against_hours():
    def cand(cost, hours, nodes=1):
        return SimpleNamespace(cost_usd=cost, hours=hours, layout=SimpleNamespace(nodes=nodes))

    priced, unpriced = cand(1000.0, 1.0, 8), cand(None, 2.0, 2)
    assert cheapest([priced, unpriced]) is unpriced  # 4 instance-hours against 8, not $1000 against 4
    assert cheapest([priced, cand(500.0, 3.0, 8)]).cost_usd == 500.0  # all priced: by dollars
    assert cheapest([]) is None

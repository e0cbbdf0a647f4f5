"""Prices: the catalog cites each one or has none, and the planner says "price unknown" rather than invent one."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from jobs import catalog
from jobs.planning import plan_request
from jobs.planning.warnings import cheapest
from jobs.request import parse_request


def sized(instance_type: str, **sizing):
    return plan_request(parse_request({"name": "prices", "dataset": "s3://bucket/data/", "model": "gpt",
                                       "model_size": "125m", "instance": {"type": instance_type},
                                       "sizing": {"dataset_tokens": 10**10, **sizing}}))


def test_every_price_names_a_catalog_type_and_reaches_its_spec():
    names = {t.removeprefix("ml.") for t in catalog.CATALOG}
    assert set(catalog.PRICE_USD_HOUR) <= names
    for spec in catalog.CATALOG.values():
        assert spec.price_usd_hour == catalog.PRICE_USD_HOUR.get(spec.instance_type.removeprefix("ml."))


def test_spot_assumptions_stay_plausible():
    # Labelled assumptions in jobs/catalog.py: AWS bounds the saving at 90%; a rate is a fraction per month.
    assert 0 < catalog.SPOT_SAVINGS <= 0.9 and 0 < catalog.SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH < 1


@pytest.mark.parametrize("budget", [None, 50.0])
def test_an_unpriced_type_warns_price_unknown_and_has_no_cost(budget):
    spec = catalog.lookup("ml.p5en.48xlarge")
    assert spec.price_usd_hour is None
    result = sized(spec.instance_type, **({"budget_usd": budget} if budget else {}))
    rec = result.recommendation
    assert rec.cost_usd is None and rec.cost_on_demand_usd is None
    [warning] = [w for w in result.warnings if w.code == "price_unknown"]
    assert "ml.p5en.48xlarge" in warning.message
    assert ("cannot check sizing.budget_usd=50" in warning.message) == (budget is not None)
    assert "over_budget" not in {w.code for w in result.warnings}


def test_a_priced_type_is_costed_and_checked_against_the_budget(monkeypatch):
    spec = catalog.lookup("ml.p4d.24xlarge")
    monkeypatch.setitem(catalog.CATALOG, spec.instance_type, dataclasses.replace(spec, price_usd_hour=10.0))
    result = sized(spec.instance_type, budget_usd=1)
    rec = result.recommendation
    assert rec.cost_usd == pytest.approx(rec.hours * rec.layout.nodes * 10.0)
    codes = {w.code for w in result.warnings}
    assert "over_budget" in codes and "price_unknown" not in codes


def test_cheapest_never_weighs_dollars_against_hours():
    def cand(cost, hours, nodes=1):
        return SimpleNamespace(cost_usd=cost, hours=hours, layout=SimpleNamespace(nodes=nodes))

    priced, unpriced = cand(1000.0, 1.0, 8), cand(None, 2.0, 2)
    assert cheapest([priced, unpriced]) is unpriced  # 4 instance-hours against 8, not $1000 against 4
    assert cheapest([priced, cand(500.0, 3.0, 8)]).cost_usd == 500.0  # all priced: by dollars
    assert cheapest([]) is None

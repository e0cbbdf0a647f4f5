"""One rule for what a price is (jobs.prices.usd_per_hour), the same from every place a price enters: the AWS Price
List API's answer (trainctl's and the launcher's Summarize), a --prices file, trainctl's cache, the planner's table,
and the run record's cost (trainctl runs/show, the summary). A bad price is never taken as a price: the place that
can say so to a person refuses it naming the type, the value and the rule; the others leave the type unpriced."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from cli import price_source as cli_prices
from cli.errors import UserError
from jobs.outcome.run_record import run_cost
from jobs.planning import PlanInputError
from jobs.prices import PRICE_RULE, products_to_prices, usd_per_hour
from tests.cli.test_plan_prices import NOW, REGION, product
from tests.jobs.outcome.test_run_record import attempt
from tests.jobs.test_prices import sized

TYPE = "ml.p4d.24xlarge"
# Each bad price as JSON writes it (a file, the cache) and as the API would carry it (its decimal strings).
BAD = {"negative": (-1.0, "-1.0000000000"), "zero": (0, "0.0000000000"), "nan": (math.nan, "NaN"),
       "infinite": (math.inf, "Infinity"), "string": ("10", "ten"), "boolean": (True, "true"), "null": (None, None)}


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_the_rule_takes_positive_finite_numbers_only():
    assert [usd_per_hour(v) for v in (32.77, 3, 1e-6)] == [32.77, 3.0, 1e-6]
    assert all(usd_per_hour(value) is None for value, _ in BAD.values())


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_the_api_answer_leaves_the_type_unpriced(bad):
    _, as_api = BAD[bad]
    prices, unresolved, skipped = products_to_prices([product(TYPE, as_api), product("ml.p5.48xlarge", "50.5")],
                                                     REGION)
    assert prices == {"ml.p5.48xlarge": 50.5} and not unresolved and not skipped


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_a_price_file_is_refused_naming_the_type_the_value_and_the_rule(bad, tmp_path):
    value, _ = BAD[bad]
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"ml.p5.48xlarge": 50.5, TYPE: value}))
    with pytest.raises(UserError) as refused:
        cli_prices.load_price_file(path)
    assert f"{TYPE}: {PRICE_RULE}, got {json.dumps(value)}" in str(refused.value)


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_a_cache_holding_it_is_not_used(bad):
    value, _ = BAD[bad]
    fresh = cli_prices.PriceTable("aws", {"ml.p5.48xlarge": 50.5}, region=REGION, date=NOW)
    assert cli_prices.write_cache(fresh) is None
    assert cli_prices.read_cache(REGION, NOW + dt.timedelta(hours=1)).prices == {"ml.p5.48xlarge": 50.5}
    path = cli_prices.cache_path(REGION)
    doc = json.loads(path.read_text())
    doc["usd_per_hour"][TYPE] = value
    path.write_text(json.dumps(doc))
    assert cli_prices.read_cache(REGION, NOW + dt.timedelta(hours=1)) is None  # asked again instead


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_the_planner_refuses_it_naming_the_type(bad):
    value, _ = BAD[bad]
    with pytest.raises(PlanInputError) as refused:
        sized(TYPE, {TYPE: value})
    assert refused.value.field == f"prices[{TYPE!r}]" and refused.value.fix == PRICE_RULE


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_the_run_record_leaves_the_type_unpriced(bad):
    value, _ = BAD[bad]
    cost = run_cost([attempt(1), attempt(2, instance_type=TYPE)], {"ml.p5.48xlarge": 36.0, TYPE: value})
    assert cost["unpriced"] == [TYPE] and cost["on_demand_usd"] is None and cost["total_usd"] is None


def test_a_missing_price_is_unknown_everywhere(tmp_path):
    """No entry for the type (the other way a price is bad): unpriced, never refused and never zero."""
    assert products_to_prices([product("ml.p5.48xlarge", "50.5")], REGION)[0].get(TYPE) is None
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"ml.p5.48xlarge": 50.5}))
    assert TYPE not in cli_prices.load_price_file(path).prices
    assert {w.code for w in sized(TYPE, {"ml.p5.48xlarge": 50.5}).warnings} >= {"price_unknown"}
    assert run_cost([attempt(1, instance_type=TYPE)], {"ml.p5.48xlarge": 36.0})["unpriced"] == [TYPE]

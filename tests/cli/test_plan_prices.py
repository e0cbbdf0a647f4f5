"""`trainctl plan --prices`: the AWS Price List API (botocore's Stubber, never the network), a file, none, auto.

Every price here is synthetic (round numbers): the tests check how prices are read and used, not what AWS charges.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import zlib
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber
from rich.console import Console

from cli import price_source as prices
from cli.aws import Aws
from cli.errors import UserError
from cli.views.plan import plan_json, print_sizing, sizing_result
from jobs.catalog import SPOT_SAVINGS
from jobs.prices import products_to_prices
from jobs.request.parse import parse_request
from tests.cli.conftest import DATA, run

REGION = "us-east-1"
NOW = dt.datetime(2026, 5, 4, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """No test here may reach a network, and none may read or write the user's cache."""

    def refuse(self, address):
        raise AssertionError(f"a test tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def product(instance: str, usd: str, *, component: str | None = "Training", usage: str | None = None,
            unit: str = "Hrs", region: str = REGION) -> str:
    """One PriceList entry in the shape GetProducts returns: a JSON string with product and terms."""
    attributes = {"servicecode": "AmazonSageMaker", "regionCode": region, "instanceName": instance,
                  "usagetype": usage or f"USE1-Train:{instance}", "locationType": "AWS Region"}
    if component is not None:
        attributes["component"] = component
    sku = f"SKU{zlib.crc32(repr((instance, usd, component, usage, unit, region)).encode()):010d}"
    return json.dumps({
        "product": {"productFamily": "ML Instance", "attributes": attributes, "sku": sku},
        "serviceCode": "AmazonSageMaker",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-04-01T00:00:00Z",
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "description": f"{instance} {unit}", "unit": unit,
                "beginRange": "0", "endRange": "Inf", "pricePerUnit": {"USD": usd}}},
            "termAttributes": {}}}},
        "version": "20260401000000", "publicationDate": "2026-04-01T00:00:00Z"})


def expected(region: str = REGION, token: str | None = None) -> dict:
    params = {"ServiceCode": "AmazonSageMaker", "FormatVersion": "aws_v1", "MaxResults": 100,
              "Filters": [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
                          {"Type": "TERM_MATCH", "Field": "component", "Value": "Training"}]}
    return params | ({"NextToken": token} if token else {})


PAGE_1 = [
    product("ml.p4d.24xlarge", "10.0000000000"),
    product("ml.p4d.24xlarge", "99.0000000000", component="Hosting", usage="USE1-Host:ml.p4d.24xlarge"),
    product("ml.p5.48xlarge", "20.0000000000"),
    product("ml.p5.48xlarge", "20.00", usage="USE1-Train-other:ml.p5.48xlarge"),  # same price, another usage type
]
PAGE_2 = [
    product("ml.g5.48xlarge", "7.0000000000"),
    product("ml.g5.48xlarge", "8.0000000000", usage="USE1-Train-other:ml.g5.48xlarge"),  # conflicting prices
    product("ml.p4de.24xlarge", "5.0000000000", component=None, unit="Quantity",
            usage="USE1-TrainingPlanUpfrontFee:ml.p4de.24xlarge"),  # a fee, no component: not an hourly rate
    product("ml.g6e.48xlarge", "0.0000000000"),  # a zero price is no price
    product("ml.g5.12xlarge", "3.0000000000", region="us-west-2"),  # another region
    product("ml.m4.16xlarge", "4.0000000000"),  # not in the catalog
]


def stubbed_client(*pages: list[str], region: str = REGION):
    client = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing").client(
        "pricing", region_name="us-east-1")
    stubber = Stubber(client)
    for i, page in enumerate(pages):
        response = {"FormatVersion": "aws_v1", "PriceList": page}
        if i + 1 < len(pages):
            response["NextToken"] = f"token-{i + 1}"
        stubber.add_response("get_products", response, expected(region, f"token-{i}" if i else None))
    stubber.activate()
    return client, stubber


@pytest.fixture
def api(monkeypatch):
    """The pricing client trainctl creates, replaced by a stubbed one; returns a function that queues pages."""
    made = {}

    def queue(*pages, region=REGION, error=None):
        client, stubber = stubbed_client(*pages, region=region)
        if error:
            stubber.add_client_error("get_products", service_error_code=error[0], service_message=error[1],
                                     expected_params=expected(region))
        made["stubber"] = stubber
        monkeypatch.setattr(prices, "pricing_client", lambda session: client)
        return stubber

    return queue


@pytest.fixture
def credentials(monkeypatch, tmp_path):
    """Credentials boto3 finds (fake ones: every call they would sign is stubbed)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTESTING")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))


def session():
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")


# ---- the Price List API ------------------------------------------------------------------------------------


def test_the_api_is_read_over_every_page_keeping_only_on_demand_training_hours(api):
    stubber = api(PAGE_1, PAGE_2)
    table = prices.fetch_aws_prices(session(), REGION, NOW)
    stubber.assert_no_pending_responses()  # both pages asked for, the second with the first's NextToken
    assert table.source == "aws" and table.region == REGION and table.date == NOW
    # p4d: the Training product, not the Hosting one; p5: two usage types at one price; p4de: a fee, not an hourly
    # rate; g6e: 0; us-west-2 and a type outside the catalog: not this plan's.
    assert table.prices == {"ml.p4d.24xlarge": 10.0, "ml.p5.48xlarge": 20.0}
    assert set(table.unresolved) == {"ml.g5.48xlarge"}
    why = table.unresolved["ml.g5.48xlarge"]
    assert "2 different on-demand training prices" in why and "rather than guess" in why
    assert "$7/h: USE1-Train:ml.g5.48xlarge; $8/h: USE1-Train-other:ml.g5.48xlarge" in why
    assert ("price_conflict", f"ml.g5.48xlarge: {why}") in table.warnings()


def test_the_parser_takes_parsed_products_and_skips_unreadable_entries():
    found, unresolved, skipped = products_to_prices(
        [json.loads(PAGE_1[0]), "not json", json.dumps({"terms": {}})], REGION)
    assert found == {"ml.p4d.24xlarge": 10.0} and unresolved == {} and skipped == 2


def test_access_denied_is_one_line_naming_the_action_and_the_fix(api):
    api(error=("AccessDeniedException", "User: arn:aws:iam::123456789012:user/me is not authorized to perform: "
                                        "pricing:GetProducts"))
    with pytest.raises(UserError) as info:
        prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)
    assert info.value.message.startswith("--prices aws: access denied to pricing:GetProducts")
    assert "\n" not in info.value.message
    assert "pricing:GetProducts" in info.value.hint and "--prices FILE.json" in info.value.hint


def test_access_denied_through_the_cli_exits_2_without_a_traceback(api, credentials, platform_file):
    api(error=("AccessDeniedException", "not authorized to perform: pricing:GetProducts"))
    result = run("plan", DATA / "ddp.json", "--platform", platform_file, "--prices", "aws")
    assert result.exit_code == 2 and result.stdout == "" and "Traceback" not in result.output
    assert "error: --prices aws: access denied to pricing:GetProducts" in result.stderr
    assert "allow the IAM action pricing:GetProducts" in result.stderr


def test_no_network_is_named_with_the_fix(monkeypatch):
    class Unreachable:
        def get_paginator(self, name):
            raise EndpointConnectionError(endpoint_url="https://api.pricing.us-east-1.amazonaws.com/")

    monkeypatch.setattr(prices, "pricing_client", lambda session: Unreachable())
    with pytest.raises(UserError) as info:
        prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)
    assert "--prices aws: cannot reach the AWS Price List API" in info.value.message
    assert "check the network" in info.value.hint


def test_aws_without_credentials_says_so_before_any_request(platform_file):
    result = run("plan", DATA / "ddp.json", "--platform", platform_file, "--prices", "aws")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--prices aws: no AWS credentials found to call the AWS Price List API" in result.stderr


def test_a_region_without_training_products_is_an_error_for_aws(api):
    api([])
    with pytest.raises(UserError, match="no AmazonSageMaker Training products for region us-east-1"):
        prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)


# ---- the cache ---------------------------------------------------------------------------------------------


def test_the_answer_is_cached_per_region_and_reused_for_seven_days(api, credentials, monkeypatch):
    stubber = api(PAGE_1, PAGE_2)
    fetched = prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)
    stubber.assert_no_pending_responses()
    path = prices.cache_path(REGION)
    doc = json.loads(path.read_text())
    assert path.name == "prices-us-east-1.json" and doc["fetched"] == "2026-05-04T12:00:00Z"
    assert doc["usd_per_hour"] == fetched.prices and "ml.g5.48xlarge" in doc["unresolved"]

    monkeypatch.setattr(prices, "pricing_client", lambda session: pytest.fail("the cache should have answered"))
    later = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW + dt.timedelta(days=6))
    assert later.cached and later.prices == fetched.prices and later.date == NOW
    assert "fetched 2026-05-04 (cached in" in later.describe()

    stubber = api([product("ml.p4d.24xlarge", "11.0")])  # a week on, auto asks again
    stale = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW + dt.timedelta(days=8))
    stubber.assert_no_pending_responses()
    assert not stale.cached and stale.prices == {"ml.p4d.24xlarge": 11.0}


def test_aws_refreshes_a_fresh_cache(api, credentials):
    api(PAGE_1, PAGE_2)
    prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)
    stubber = api([product("ml.p4d.24xlarge", "12.0")])
    again = prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW + dt.timedelta(hours=1))
    stubber.assert_no_pending_responses()
    assert again.prices == {"ml.p4d.24xlarge": 12.0} and not again.cached
    assert json.loads(prices.cache_path(REGION).read_text())["usd_per_hour"] == {"ml.p4d.24xlarge": 12.0}


@pytest.mark.parametrize("content", ["not json", '{"region": "us-east-1"}', '[]'])
def test_an_unreadable_cache_is_asked_again(api, credentials, content):
    path = prices.cache_path(REGION)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    stubber = api(PAGE_1)
    assert prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW).prices["ml.p4d.24xlarge"] == 10.0
    stubber.assert_no_pending_responses()


# ---- auto ----------------------------------------------------------------------------------------------------


def test_auto_without_credentials_plans_without_prices_and_no_call(monkeypatch, platform_file):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(prices, "pricing_client", lambda session: pytest.fail("auto called the API"))
    table = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW)
    assert table.source == "none" and table.prices == {} and "no AWS credentials found" in table.reason

    result = run("plan", DATA / "ddp.json", "--platform", platform_file, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "prices: none: no AWS credentials found, so --prices auto plans without prices" in result.stdout
    doc = json.loads(run("plan", DATA / "ddp.json", "--platform", platform_file, "--json").stdout)
    assert doc["prices"]["source"] == "none" and doc["prices"]["date"] is None
    assert doc["recommendation"]["cost_usd"] is None


def _offline(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(prices, "pricing_client", lambda session: pytest.fail("offline, auto called the API"))


def test_auto_offline_prices_with_the_last_answer_this_machine_cached_and_says_how_old(api, credentials, monkeypatch,
                                                                                     platform_file):
    """Once online (any plan that asked the API), a plan offline or without credentials prices with that answer,
    however old, saying when it was fetched: no price file to write by hand."""
    api(PAGE_1, PAGE_2)
    fetched = prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)
    _offline(monkeypatch)
    later = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW + dt.timedelta(days=30))
    assert later.source == "aws" and later.cached and later.prices == fetched.prices and later.date == NOW
    assert any("no AWS credentials found: the AWS prices this machine fetched on 2026-05-04 (30 days ago)" in note
               for note in later.notes)
    # Another region's plan finds no answer for its own region: none, as before.
    assert prices.resolve_prices("auto", "eu-west-1", Aws(region="eu-west-1"), NOW).source == "none"
    # Through the CLI (the real clock: the cache is as old as today is after 2026-05-04): priced, and said so.
    doc = json.loads(run("plan", DATA / "spot-fallbacks.json", "--platform", platform_file, "--json").stdout)
    assert doc["prices"]["source"] == "aws" and doc["prices"]["cached"] and doc["prices"]["date"] == \
        "2026-05-04T12:00:00Z"
    assert any("the AWS prices this machine fetched on 2026-05-04" in note for note in doc["prices"]["notes"])
    rec = doc["recommendation"]
    assert rec["instance_type"] == "ml.p4d.24xlarge"
    assert rec["cost_on_demand_usd"] == pytest.approx(rec["hours"] * 10.0 * rec["instance_count"], abs=0.05)


def test_auto_prices_with_the_last_cached_answer_when_the_api_refuses(api, credentials):
    api(PAGE_1, PAGE_2)
    prices.resolve_prices("aws", REGION, Aws(region=REGION), NOW)
    api(error=("AccessDeniedException", "not authorized"))
    table = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW + dt.timedelta(days=9))
    assert table.source == "aws" and table.cached and table.prices["ml.p4d.24xlarge"] == 10.0
    assert any(note.startswith("access denied to pricing:GetProducts") and "(9 days ago)" in note
               for note in table.notes)


def test_auto_with_credentials_uses_the_api(api, credentials):
    api(PAGE_1, PAGE_2)
    table = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW)
    assert table.source == "aws" and table.prices["ml.p4d.24xlarge"] == 10.0


def test_auto_plans_without_prices_when_the_api_refuses(api, credentials):
    api(error=("AccessDeniedException", "not authorized"))
    table = prices.resolve_prices("auto", REGION, Aws(region=REGION), NOW)
    assert table.source == "none" and "access denied to pricing:GetProducts" in table.reason
    assert any("pricing:GetProducts" in note for note in table.notes)


def test_none_asks_nothing(monkeypatch):
    monkeypatch.setattr(prices, "pricing_client", lambda session: pytest.fail("none called the API"))
    table = prices.resolve_prices("none", REGION, Aws(region=REGION), NOW)
    assert table.source == "none" and table.prices == {} and table.describe() == "none: --prices none"


# ---- a file --------------------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.json"
    path.write_text(text)
    return path


def test_a_price_file_is_read(tmp_path):
    table = prices.resolve_prices(str(write(tmp_path, '{"ml.p4d.24xlarge": 10, "ml.p5.48xlarge": 20.5}')),
                                  REGION, Aws(region=REGION), NOW)
    assert table.source == "file" and table.prices == {"ml.p4d.24xlarge": 10.0, "ml.p5.48xlarge": 20.5}
    assert table.describe().startswith(f"file {tmp_path / 'prices.json'} (modified ")


@pytest.mark.parametrize(("text", "fragments"), [
    ('{"p4d.24xlarge": 10}', ["'p4d.24xlarge' is not an instance type of the catalog",
                              "did you mean 'ml.p4d.24xlarge'?"]),
    ('{"ml.p4d.24xlarge": -1}', ["ml.p4d.24xlarge: must be a positive number of USD per hour, got -1"]),
    ('{"ml.p4d.24xlarge": 0}', ["ml.p4d.24xlarge: must be a positive number of USD per hour, got 0"]),
    ('{"ml.p4d.24xlarge": "10"}', ['ml.p4d.24xlarge: must be a positive number of USD per hour, got "10"']),
    ('{"ml.p4d.24xlarge": true}', ["ml.p4d.24xlarge: must be a positive number of USD per hour, got true"]),
    ('{"ml.p4d.24xlarge": NaN}', ["ml.p4d.24xlarge: must be a positive number of USD per hour, got NaN"]),
    ('[10]', ["a price table must be a JSON object, got list"]),
    ('{"ml.p4d.24xlarge": 10,}', ["not valid JSON"]),
    ('{"ml.p4d.24xlarge": 10, "ml.p4d.24xlarge": 11}', ['key "ml.p4d.24xlarge" appears twice']),
])
def test_a_bad_price_file_is_refused_naming_the_key(tmp_path, text, fragments):
    with pytest.raises(UserError) as info:
        prices.resolve_prices(str(write(tmp_path, text)), REGION, Aws(region=REGION), NOW)
    for fragment in fragments:
        assert fragment in info.value.message


def test_a_bad_price_file_through_the_cli(tmp_path, platform_file):
    path = write(tmp_path, '{"ml.p4d.24xlarge": 10, "ml.p9.mega": 1}')
    result = run("plan", DATA / "ddp.json", "--platform", platform_file, "--prices", path)
    assert result.exit_code == 2 and result.stdout == "" and "Traceback" not in result.output
    assert "'ml.p9.mega' is not an instance type of the catalog" in result.stderr


@pytest.mark.parametrize("option", ["awz", str(Path("missing") / "prices.json")])
def test_an_unknown_choice_or_a_missing_file(option):
    with pytest.raises(UserError, match="not one of auto, aws, none|price table file not found"):
        prices.resolve_prices(option, REGION, Aws(region=REGION), NOW)


# ---- what the plan shows -----------------------------------------------------------------------------------


def sized(table, **fields):
    request = parse_request({"name": "priced", "dataset": "s3://bucket/data/", "model": "gpt", "model_size": "125m",
                             "sizing": {"dataset_tokens": 10**10}, **fields})
    return sizing_result(request, None, table.prices)


def test_costs_are_hours_times_price_times_instances(api):
    api(PAGE_1, PAGE_2)
    table = prices.fetch_aws_prices(session(), REGION, NOW)
    result = sized(table, instance={"type": "ml.p4d.24xlarge", "count": 2})
    doc = json.loads(plan_json(result, table))
    priced = 0
    for c, d in zip(result.candidates, doc["candidates"], strict=True):
        price = table.prices.get(c.instance_type)
        if price is None:
            assert c.cost_usd is None and d["cost_usd"] is None
            continue
        priced += 1
        assert c.cost_on_demand_usd == pytest.approx(c.hours * price * c.layout.nodes)
        assert c.cost_usd == pytest.approx(c.cost_on_demand_usd)  # on demand: no Spot saving
        assert d["cost_usd"] == round(c.hours * price * c.layout.nodes, 2) == d["cost_on_demand_usd"]
    assert priced > 2 and doc["recommendation"]["cost_usd"] is not None
    assert doc["prices"]["source"] == "aws" and doc["prices"]["date"] == "2026-05-04T12:00:00Z"
    assert doc["prices"]["usd_per_hour"]["ml.p4d.24xlarge"] == 10.0
    assert doc["prices"]["usd_per_hour"]["ml.g5.48xlarge"] is None
    assert "ml.g5.48xlarge" in doc["prices"]["unresolved"]

    console = Console(record=True, width=250, soft_wrap=True)
    print_sizing(console, result, table)
    text = console.export_text()
    rows = [line for line in text.splitlines() if " x ml.p4d.24xlarge " in line]
    assert rows
    shown = 0
    for c in (c for c in result.candidates if c.instance_type == "ml.p4d.24xlarge"):
        # The throughput tells apart variants of one strategy (degrees, schedule) that take about the same hours.
        cells = (f" {c.layout.strategy} ", f" {c.layout.nodes} x ml.p4d.24xlarge ", f" {c.hours:.2f} ",
                 f" {c.throughput:,.0f} ")
        for row in (row for row in rows if all(cell in row for cell in cells)):
            # Rounded to cents first, as the plan's JSON and table are (46.4999 and 46.50 print differently).
            assert f" ${round(c.hours * 10.0 * c.layout.nodes, 2):,.0f} " in row
            shown += 1
    assert shown >= 3
    assert "prices: on-demand training USD per instance-hour from AWS Price List API (AmazonSageMaker, component " \
           "Training, on demand, us-east-1), fetched 2026-05-04" in text
    assert "price_conflict: ml.g5.48xlarge: the AWS Price List API gives 2 different" in text


def test_spot_costs_take_the_assumed_saving(tmp_path):
    table = prices.load_price_file(write(tmp_path, '{"ml.p4d.24xlarge": 10}'))
    result = sized(table, instance={"type": "ml.p4d.24xlarge"}, spot=True)
    rec = result.recommendation
    assert rec.spot and rec.cost_on_demand_usd == pytest.approx(rec.hours * 10.0 * rec.layout.nodes)
    assert rec.cost_usd == pytest.approx(rec.cost_on_demand_usd * (1 - SPOT_SAVINGS))
    console = Console(record=True, width=250, soft_wrap=True)  # the temporary path is long: no line breaks
    print_sizing(console, result, table)
    assert "Spot costs take 60% off (an assumption" in console.export_text()


def test_the_cli_table_and_json_with_stubbed_api_prices(api, credentials, platform_file):
    api(PAGE_1, PAGE_2)
    result = run("plan", DATA / "spot-fallbacks.json", "--platform", platform_file, "--prices", "aws",
                 env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "fetched" in result.stdout and "AWS Price List API" in result.stdout and "$" in result.stdout
    api(PAGE_1, PAGE_2)
    doc = json.loads(run("plan", DATA / "spot-fallbacks.json", "--platform", platform_file, "--prices", "aws",
                         "--json").stdout)
    rec = doc["recommendation"]
    assert rec["instance_type"] == "ml.p4d.24xlarge"
    assert rec["cost_on_demand_usd"] == pytest.approx(rec["hours"] * 10.0 * rec["instance_count"], abs=0.05)
    assert doc["prices"]["source"] == "aws" and not doc["prices"]["cached"]
